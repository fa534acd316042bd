"""The ``freespec`` command line: model preparation, benchmark, doctor."""
