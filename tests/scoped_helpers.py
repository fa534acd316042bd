"""What the scoped response-store tests share: a save as the suffix source's save interval asks for one."""
from freespec.proposers.learned.scoped_responses import ScopedResponses


def save(sr: ScopedResponses) -> None:
    """Ask for a save and wait for it; the peers' files it read are merged by the next ticks."""
    for _ in range(10):
        sr.tick()
        if sr._files.wait(10):
            return
    raise AssertionError("the background file work did not settle")
