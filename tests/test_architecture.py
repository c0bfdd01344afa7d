"""The one-way flow of docs/architecture.md: no stage imports a later one."""

from __future__ import annotations

import ast
from pathlib import Path

import callgrove

# Beneath the stages: modules every stage may import, which import nothing of callgrove.
BENEATH = ["errors", "lazy"]
# The networks lie beneath the learners (`train`) and the samplers (`policy`, on top).
STAGES = [
    "formats",
    "episode",
    "sampling",
    "forest",
    "rows",
    "credit",
    "batch",
    "networks",
    "train",
]
# On top, in order: each may import the stages and the packages on top listed before it.
ON_TOP = [
    "synth",
    "chat",
    "transcripts",
    "interop",
    "audit",
    "pictures",
    "policy",
    "models",
    "serving",
    "gateway",
    "orchestrator",
    "bench",
    "cli",
]
PACKAGE = Path(callgrove.__file__).parent


def imported_parts(path: Path) -> set[str]:
    parts = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        parts |= {
            n.split(".")[1] for n in names if n.startswith("callgrove.") and n.count(".") >= 1
        }
    return parts


def test_every_package_is_a_known_stage():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert set(STAGES) <= packages
    assert packages <= set(STAGES) | set(ON_TOP), sorted(packages - set(STAGES) - set(ON_TOP))


def test_what_lies_beneath_the_stages_imports_none_of_them():
    for name in BENEATH:
        path = PACKAGE / f"{name}.py"
        assert not imported_parts(path), f"{name}.py imports {sorted(imported_parts(path))}"
        assert "import callgrove" not in path.read_text()


def test_no_stage_imports_a_later_stage_or_the_layer_on_top():
    for position, stage in enumerate(STAGES):
        allowed = set(BENEATH) | set(STAGES[: position + 1])
        for path in (PACKAGE / stage).rglob("*.py"):
            wrong = imported_parts(path) - allowed
            assert not wrong, f"{path.relative_to(PACKAGE)} imports {sorted(wrong)}"


def test_no_package_on_top_imports_one_listed_after_it():
    for position, name in enumerate(ON_TOP):
        if not (PACKAGE / name).is_dir():
            continue
        allowed = set(BENEATH) | set(STAGES) | set(ON_TOP[: position + 1])
        for path in (PACKAGE / name).rglob("*.py"):
            wrong = imported_parts(path) - allowed
            assert not wrong, f"{path.relative_to(PACKAGE)} imports {sorted(wrong)}"


# The sampling distribution both samplers and losses compute; the samplers' torch kernels:
# loaded only by the backends that sample in this process; and the TRL adapter, imported by
# name only, whose trainer cannot load without torch anyway.
TORCH_SAMPLERS = {
    "sampling/distribution.py",
    "policy/decode.py",
    "policy/hf_decode.py",
    "interop/trl.py",
}


def test_torch_is_imported_only_by_the_networks_the_learners_the_samplers_or_lazily():
    for path in PACKAGE.rglob("*.py"):
        top_level = [
            node
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Import | ast.ImportFrom)
        ]
        names = {a.name for n in top_level if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in top_level if isinstance(n, ast.ImportFrom) and n.module}
        if any(name == "torch" or name.startswith("torch.") for name in names):
            where = path.relative_to(PACKAGE).as_posix()
            assert where.split("/")[0] in ("networks", "train") or where in TORCH_SAMPLERS, (
                f"{path} imports torch at module level"
            )


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The callgrove modules `path` imports anywhere (in a function or under TYPE_CHECKING too):
    `from a.b import c` counts `a.b.c` where that is a module, else `a.b`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                whole = f"{node.module}.{alias.name}"
                found.add(whole if whole in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found & modules


def test_no_two_modules_import_each_other():
    """A package's `__init__` re-exports its modules, so it is left out."""
    paths = {
        ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts): path
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py"
    }
    imports = {name: imported_modules(path, set(paths)) for name, path in paths.items()}
    circles = sorted(
        f"{a} <-> {b}" for a, names in imports.items() for b in names if a < b and a in imports[b]
    )
    assert not circles, circles


def test_the_samplers_import_no_learner():
    """Samplers (`policy`) and learners (`train`) share the networks beneath them; only the door
    above both (`models`) holds the two together. (The stages' order keeps `train` from
    importing `policy`.)"""
    for path in (PACKAGE / "policy").rglob("*.py"):
        assert "train" not in imported_parts(path), f"{path.relative_to(PACKAGE)} imports train"
