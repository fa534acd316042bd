"""Long-context RAG sessions: a long document (Python's language reference, as ``pydoc_data`` carries it;
``--context-chars``) in the first turn, and turn after turn a question whose answer quotes it: the model is
asked to quote the sentence it relies on word for word, so answers copy long spans of the context."""
from __future__ import annotations

from freespec.bench.workloads.material import doc_document, sentences
from freespec.bench.workloads.session import Session, Workload

NAME = "rag"
SYSTEM = ("You answer questions about the documentation the user gives you, using only that documentation. "
          "Quote the sentences you rely on word for word, in double quotes, then explain.")
FIRST = "Documentation:\n\n{document}\n\nQuestion: {question}"
QUESTIONS = (
    'Which sentence of the documentation mentions "{phrase}"? Quote it word for word, then explain it in '
    "one sentence.",
    'What does the documentation say about "{phrase}"? Quote the sentence and the one after it.',
    'Quote the whole passage about "{phrase}" and say in which section it is.',
)
PHRASE_WORDS = 4


def phrase_of(sentence: str) -> str:
    """A few words from the middle of ``sentence``: what a question points at without giving the answer."""
    words = sentence.rstrip(".").split()
    middle = max(0, len(words) // 2 - PHRASE_WORDS // 2)
    return " ".join(words[middle:middle + PHRASE_WORDS])


def questions_for(document: str, turns: int) -> list[str]:
    """``turns`` questions on sentences spread evenly over the document, each asking for a quote."""
    found = sentences(document)
    if not found:
        return []
    picks = [found[(i * len(found)) // turns] for i in range(turns)] if len(found) >= turns else \
        [found[i % len(found)] for i in range(turns)]
    return [QUESTIONS[i % len(QUESTIONS)].format(phrase=phrase_of(s)) for i, s in enumerate(picks)]


def build(sessions: int, turns: int, context_chars: int) -> Workload:
    """``sessions`` sessions of ``turns`` questions, each on a document starting at another topic."""
    description = (f"long-context RAG: a language-reference document of at most {context_chars} characters "
                   f"and {turns} questions whose answers quote it")
    built = []
    for i in range(sessions):
        document, topics = doc_document(context_chars, start=2 * i)
        questions = questions_for(document, turns)
        if not questions:
            continue
        questions[0] = FIRST.format(document=document.strip(), question=questions[0])
        name = topics[0] if topics else "docstrings"
        built.append(Session(f"{NAME}-{i}-{name}", questions, system=SYSTEM))
    if not built:
        return Workload(NAME, description, skipped="no document with quotable sentences was found "
                                                   "(pydoc_data and the standard library's sources are missing)")
    return Workload(NAME, description, built)
