"""The tuning constants of the scorers and the learning proposers are defined in one table (scorers/tuning.py),
each with its meaning."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The modules of the controller that decides whether drafting pays: the goodput policy with its padding,
# step-aside, source pricing, and the controller that asks them.
CONTROLLER = ["scorers/policy.py", "scorers/padding.py", "scorers/step_aside.py", "scorers/fusion.py",
              "scorers/controller.py", "proposers/hybrid.py"]
# The acceptance estimates and the proposers' own knobs (recycle's module also holds limits, not tunings:
# only its probe interval is read from the table).
ESTIMATES = ["scorers/chain.py", "scorers/calibration.py", "scorers/acceptance.py", "proposers/copy.py",
             "proposers/pearl/state.py"]
READERS = CONTROLLER + ESTIMATES + ["proposers/recycle/proposer.py",
                                    "proposers/suffix_tree.py"]  # the suffix source sizes its chain by the price


def _numeric(node: ast.AST) -> bool:
    """A number, a tuple or list of numbers (bucket edges), or arithmetic on numbers and names
    (``1.0 - 1.0 / PHASE_STEPS``)."""
    if isinstance(node, (ast.Tuple, ast.List)):
        return bool(node.elts) and all(_numeric(n) for n in node.elts)
    if isinstance(node, ast.Call) and node.args:  # np.array([...]) of numbers
        return _numeric(node.args[0])
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _numeric(node.operand)
    if isinstance(node, ast.BinOp):
        return all(_numeric(n) or isinstance(n, ast.Name) for n in (node.left, node.right)) and (
            _numeric(node.left) or _numeric(node.right))
    return False


def test_no_controller_or_estimate_module_defines_a_tuning_constant_of_its_own():
    defined = []
    for path in CONTROLLER + ESTIMATES:
        for node in ast.parse((ROOT / path).read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            value = getattr(node, "value", None)
            for target in targets:
                if isinstance(target, ast.Name) and value is not None and _numeric(value):
                    defined.append(f"{path}: {target.id}")
    assert defined == []


def test_every_tuning_constant_says_what_it_means_and_is_read_by_the_controller():
    text = (ROOT / "scorers/tuning.py").read_text()
    names = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign):
            name = node.targets[0].id
            names.append(name)
            line = text.splitlines()[node.lineno - 1]
            assert "  # " in line and len(line.split("  # ", 1)[1]) > 10, f"{name} has no meaning beside it"
    assert len(names) >= 33
    used = "\n".join((ROOT / path).read_text() for path in READERS)
    assert [name for name in names if name not in used] == []  # no constant left over
