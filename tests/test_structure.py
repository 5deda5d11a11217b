"""The code-structure rules of docs/design.md ("Code rules"), checked on every run:

* no Python module in mtpspec/ or experiments/ over 500 lines, no function over 100 lines;
* no private name (``_x``) of one module used by another, in mtpspec/ and experiments/
  (tests may reach into privates for fault injection and negative controls);
* no script assigns into the library (no monkeypatching from experiments/);
* no link or path pointing outside the repository in the docs, code or notebooks;
* adding a proposer is one module: every module in ``decoding/proposers`` registers itself.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CODE = sorted(
    p
    for d in ("mtpspec", "experiments")
    for p in (ROOT / d).rglob("*.py")
    if ".venv" not in p.parts
)
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 500, 100


def _rel(p: pathlib.Path) -> str:
    return str(p.relative_to(ROOT))


def test_module_and_function_sizes():
    long_modules, long_functions = [], []
    for path in CODE:
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            long_modules.append(f"{_rel(path)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{_rel(path)}:{node.lineno} {node.name}: {n} lines")
    assert not long_modules, long_modules
    assert not long_functions, long_functions


def _module_aliases(tree: ast.Module) -> dict[str, str]:
    """Local names bound to first-party modules -> the module's dotted name."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ("mtpspec", "experiments"):
                    aliases[a.asname or a.name.split(".")[0]] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
            "mtpspec",
            "experiments",
        ):
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _first_party_uses(path: pathlib.Path):
    """(line, text) of every private first-party name used, and of every assignment into a
    first-party module, in one file."""
    tree = ast.parse(path.read_text())
    aliases = _module_aliases(tree)
    private = re.compile(r"^_[^_]")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
            "mtpspec",
            "experiments",
        ):
            for a in node.names:
                if private.match(a.name):
                    yield node.lineno, f"imports {node.module}.{a.name}"
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in aliases and private.match(node.attr):
                yield node.lineno, f"uses {aliases[node.value.id]}.{node.attr}"
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                    if t.value.id in aliases:
                        yield node.lineno, f"assigns {aliases[t.value.id]}.{t.attr}"


def test_no_private_names_across_modules_and_no_patching():
    found = [f"{_rel(p)}:{line} {what}" for p in CODE for line, what in _first_party_uses(p)]
    assert not found, found


def test_the_checker_finds_what_it_should(tmp_path):
    """Negative control for the two checks above."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from mtpspec.decoding import program\n"
        "from mtpspec.models.decoder import _run_layers\n"
        "from mtpspec import sharding\n"
        "program._step(1)\n"
        "sharding.rule = None\n"
    )
    found = [what for _, what in _first_party_uses(bad)]
    assert "imports mtpspec.models.decoder._run_layers" in found
    assert "uses mtpspec.decoding.program._step" in found
    assert "assigns mtpspec.sharding.rule" in found


TEXT_FILES = [
    p
    for pattern in ("*.md", "*.py", "*.ipynb", "Makefile", "*.cfg", "*.toml", "*.sh")
    for p in ROOT.rglob(pattern)
    if not {".venv", ".venv-hf", ".venv-hf-test", ".git", ".jax_cache"} & set(p.parts)
]


def test_no_links_outside_the_repository():
    outside = []
    link = re.compile(r"\]\(([^)#\s]+)")  # markdown links
    sibling = "../" + "shared"  # the workspace folder beside the clone, which CI does not have
    for path in TEXT_FILES:
        text = path.read_text(errors="replace")
        if sibling in text:
            outside.append(f"{_rel(path)}: mentions {sibling}")
        if path.suffix != ".md":
            continue
        for target in link.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            resolved = (path.parent / target).resolve()
            if ROOT not in resolved.parents and resolved != ROOT:
                outside.append(f"{_rel(path)}: link {target} leaves the repository")
            elif not resolved.exists():
                outside.append(f"{_rel(path)}: link {target} does not exist")
    assert not outside, outside


def test_every_proposer_module_registers_itself():
    from mtpspec.decoding import proposers

    modules = sorted(
        p.stem for p in (ROOT / "mtpspec/decoding/proposers").glob("*.py") if p.stem[0] != "_"
    )
    modules.remove("base")
    assert {"mtp", "ngram", "draft"} <= set(proposers.names())
    assert sorted(proposers.names()) == modules  # one module per proposer, named after it


def _registered() -> list[str]:
    from mtpspec.decoding import proposers

    return sorted(proposers.names())


@pytest.mark.parametrize("name", _registered())
def test_registered_proposers_implement_the_protocol(name):
    from mtpspec.decoding import proposers

    cls = proposers.lookup(name)
    for method in ("init", "propose", "update"):
        assert getattr(cls, method) is not getattr(proposers.Proposer, method), (name, method)
    with pytest.raises(ValueError, match="unknown proposer"):
        proposers.lookup("eagle")


# Development history lives in the lab notes (BUILD_NOTES.md, dated, with commands); the design,
# the Makefile and the package describe the project as it is.
NARRATION = re.compile(
    r"\b(?:first|second|third|[a-z]+th|[a-z]+-(?:first|second|third)|\d+(?:st|nd|rd|th))"
    r"\s+sessions?\b|\bissue\s+#?\d+",
    re.IGNORECASE,
)


def _narration(paths) -> list[str]:
    return [
        f"{_rel(path) if ROOT in path.parents else path.name}:{i}: {m.group(0)}"
        for path in paths
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        for m in NARRATION.finditer(line)
    ]


def test_no_development_narration_in_the_design_the_makefile_or_the_package(tmp_path):
    paths = [ROOT / "docs" / "design.md", ROOT / "Makefile"]
    paths += [p for p in (ROOT / "mtpspec").rglob("*") if p.suffix in (".py", ".cc", ".h", ".md")]
    assert not _narration(paths)
    probe = tmp_path / "probe.md"  # the check itself finds what it should
    probe.write_text("a ninth session; the twenty-second session; issue 35; a fresh session\n")
    assert [line.split(": ", 1)[1] for line in _narration([probe])] == [
        "ninth session", "twenty-second session", "issue 35"
    ]  # fmt: skip


# experiments/*.py are user tools: absl scripts with a usage docstring (what ``--help`` prints)
# whose shared flags all come from experiments/cli.py. real_size_oracle.py runs in a torch venv
# without mtpspec or absl (argparse); investigations live in experiments/investigations/.
TOOLS = sorted(
    p for p in (ROOT / "experiments").glob("*.py") if p.stem not in ("__init__", "cli")
)  # fmt: skip
NOT_ABSL = {"real_size_oracle"}


def test_tools_share_one_flag_vocabulary_and_say_what_they_do():
    from experiments import cli

    define = re.compile(r"\bDEFINE_\w+\(\s*\"(\w+)\"")
    problems = []
    for path in TOOLS:
        source = path.read_text()
        own = set(define.findall(source)) & set(cli.SHARED_FLAGS)
        if own:
            problems.append(f"{path.name} defines {sorted(own)} itself (use experiments/cli.py)")
        doc = ast.get_docstring(ast.parse(source)) or ""
        if f"python -m experiments.{path.stem}" not in doc and path.stem not in NOT_ABSL:
            problems.append(f"{path.name}: its docstring shows no `python -m` usage")
        if path.stem not in NOT_ABSL and "cli.run(" not in source:
            problems.append(f"{path.name} does not run through cli.run (one-line errors)")
    assert len(TOOLS) >= 15 and not problems, problems
    assert not (ROOT / "experiments" / "native").exists()  # benches: investigations/native
