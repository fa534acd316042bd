"""freespec-phrases: an example freespec proposer plugin (docs/write-a-proposer.md in freespec's repository)."""
from freespec_phrases.proposer import PhraseOptions, PhraseProposer

__all__ = ["PhraseOptions", "PhraseProposer"]
