#!/bin/bash
# Run AX's script in float32: none (always added), suffix, hybrid cold, hybrid warm, interleaved, 2 rounds.
exec env DTYPE=float32 W=/tmp/run-ay bash "$(dirname "$0")/../run-ax/run_ax.sh" "$@"
