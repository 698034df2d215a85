"""Write peer/GAPS.md: what drivetrain must add for the reference's tests to pass, ordered by how many of the
tests that pass on the reference each gap holds back.

(a) Imports and module-path strings: every `from drivetrain... import name`, `import drivetrain...` and
    "drivetrain.x.y" string (mock.patch targets, logger names) in the renamed tests and test_utils, resolved
    with drivetrain's interpreter (peer/resolve.py). An unresolved one at file level (or in the part of
    `drivetrain.test_utils` a file imports) holds back every test of that file; inside a test, that test;
    inside setUp, the tests of the class; inside a helper, the tests that call the helper.
(b) Failures after import: the diagnostic run (`--diagnose`, missing names deferred to first use) gives each
    test that passes on the reference and fails here a category (missing name, signature, behaviour, message
    wording, private internals, timeout) and a key; the keys are ranked by tests held back.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

from peer import source

PEER = Path(__file__).resolve().parent
PAGE = PEER / "GAPS.md"
PACKAGE = "drivetrain"
TEST_UTILS = f"{PACKAGE}.test_utils"
FIXTURE_FUNCTIONS = {"setUp", "setUpClass", "tearDown", "tearDownClass", "setup_method", "setup_class"}


# ---------------------------------------------------------------- (a) static scan of the renamed files


class _Scan(ast.NodeVisitor):
    """Records drivetrain imports and module-path strings with their scope: ("file",), ("test", class, func),
    ("fixture", class), ("helper", name)."""

    def __init__(self, module: str, is_package: bool):
        self.module, self.is_package = module, is_package
        self.imports: list[tuple[str, str, tuple]] = []  # (module, name, scope)
        self.paths: list[tuple[str, tuple]] = []
        self.functions: dict[str | None, set[str]] = defaultdict(
            set
        )  # class (None: module) -> function names
        self.calls: dict[tuple, set[str]] = defaultdict(set)  # scope -> names used inside it
        self._class: str | None = None
        self._function: str | None = None

    def _scope(self) -> tuple:
        if self._function is None:
            return ("file",)
        if self._function in FIXTURE_FUNCTIONS:
            return ("fixture", self._class)
        if self._function.startswith("test"):
            return ("test", self._class, self._function)
        return ("helper", self._function)

    def visit_ClassDef(self, node):
        if self._function is not None or self._class is not None:
            return self.generic_visit(node)
        self._class = node.name
        self.generic_visit(node)
        self._class = None

    def visit_FunctionDef(self, node):
        if self._function is not None:
            return self.generic_visit(node)
        self.functions[self._class].add(node.name)
        self._function = node.name
        self.generic_visit(node)
        self._function = None

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ImportFrom(self, node):
        if node.level:
            parts = self.module.split(".")
            base = parts if self.is_package else parts[:-1]
            base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        if module == PACKAGE or module.startswith(PACKAGE + "."):
            for alias in node.names:
                self.imports.append((module, alias.name, self._scope()))

    def visit_Import(self, node):
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                self.imports.append((alias.name, "*", self._scope()))

    def visit_Constant(self, node):
        if isinstance(node.value, str) and re.fullmatch(rf"{PACKAGE}(\.[A-Za-z_]\w*)+", node.value):
            self.paths.append((node.value, self._scope()))

    def visit_Name(self, node):
        self.calls[self._scope()].add(node.id)

    def visit_Attribute(self, node):
        self.calls[self._scope()].add(node.attr)
        self.generic_visit(node)


def _scan(path: Path, module: str) -> _Scan:
    scan = _Scan(module, path.name == "__init__.py")
    scan.visit(ast.parse(path.read_text(encoding="utf-8")))
    return scan


def _test_utils_modules(work: Path) -> dict[str, _Scan]:
    scans = {}
    for path in sorted((work / "test_utils").rglob("*.py")):
        parts = path.relative_to(work / "test_utils").with_suffix("").parts
        name = ".".join([TEST_UTILS, *[p for p in parts if p != "__init__"]])
        scans[name] = _scan(path, name)
    return scans


def _closure(start: set[str], scans: dict[str, _Scan]) -> set[str]:
    """test_utils modules loaded when `start` are imported (parents first, then their file-level imports)."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        if name in seen or name not in scans:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(2, len(parts)))  # parent packages run first
        for module, imported, scope in scans[name].imports:
            if scope == ("file",) and module.startswith(TEST_UTILS):
                todo.append(module)
                todo.append(f"{module}.{imported}")  # `from package import submodule`
    return seen


def _tests_for_scope(scope: tuple, scan: _Scan, test_ids: list[str]) -> list[str]:
    if scope == ("file",):
        return test_ids
    if scope[0] == "fixture":
        return [t for t in test_ids if t.split("::")[1:2] == [scope[1]]]
    if scope[0] == "helper":
        users = {s[2] for s, names in scan.calls.items() if s[0] == "test" and scope[1] in names}
        return [t for t in test_ids if _function_of(t, scan) in users]
    return [t for t in test_ids if _function_of(t, scan) == scope[2]]


def _function_of(test_id: str, scan: _Scan) -> str | None:
    parts = test_id.split("::")
    name, klass = parts[-1], (parts[1] if len(parts) == 3 else None)
    candidates = (
        scan.functions.get(klass) or set().union(*scan.functions.values()) if scan.functions else set()
    )
    matches = [f for f in candidates if name == f or name.startswith((f + "_", f + "["))]
    return max(matches, key=len) if matches else None


def static_gaps(work: Path, reference: dict, python: Path) -> dict:
    """Unresolved imports and module-path strings, each with the reference test ids it holds back."""
    ref_files = reference.get("files", {})
    utils = _test_utils_modules(work)
    users: dict[tuple, set[str]] = defaultdict(set)  # ("name", module, name) or ("path", p) -> test ids
    sites: dict[tuple, set[str]] = defaultdict(set)  # where the gap is written
    for file, data in ref_files.items():
        test_ids = [t for t, r in data["tests"].items() if r["outcome"] != "not applicable"]
        if not (work / file).is_file() or not test_ids:
            continue
        scan = _scan(work / file, Path(file).stem)
        wanted = {m for m, _, s in scan.imports if s == ("file",) and m.startswith(TEST_UTILS)}
        wanted |= {f"{m}.{n}" for m, n, s in scan.imports if s == ("file",) and m.startswith(TEST_UTILS)}
        for module in _closure(wanted, utils):
            if ".external_deps" in module:
                continue
            for imported_module, name, scope in utils[module].imports:
                if scope == ("file",) and not imported_module.startswith(TEST_UTILS):
                    users[("name", imported_module, name)].update(test_ids)
                    sites[("name", imported_module, name)].add(module)
        for module, name, scope in scan.imports:
            if module.startswith(TEST_UTILS):
                continue
            users[("name", module, name)].update(_tests_for_scope(scope, scan, test_ids))
            sites[("name", module, name)].add(file)
        for path, scope in scan.paths:
            users[("path", path)].update(_tests_for_scope(scope, scan, test_ids))
            sites[("path", path)].add(file)
    # The scripts: their own file-level and function-level gaps (they run under the launcher, not pytest).
    for module, scan in utils.items():
        if ".scripts." not in module or ".external_deps" in module:  # external_deps: GPU/hub scripts, not run
            continue
        for imported_module, name, _ in scan.imports:
            if not imported_module.startswith(TEST_UTILS):
                users.setdefault(("name", imported_module, name), set())
                sites[("name", imported_module, name)].add(module)
        for path, _ in scan.paths:
            users.setdefault(("path", path), set())
            sites[("path", path)].add(module)
    request = {
        "names": sorted({(k[1], k[2]) for k in users if k[0] == "name"}),
        "paths": sorted({k[1] for k in users if k[0] == "path"}),
    }
    done = subprocess.run(
        [str(python), "-m", "peer.resolve"], input=json.dumps(request), capture_output=True, text=True,
        cwd=PEER.parent, check=True,
    )  # fmt: skip
    answer = json.loads(done.stdout)
    passing = {t for f in ref_files.values() for t, r in f["tests"].items() if r["outcome"] == "passed"}
    names = []
    for item in answer["names"]:
        key = ("name", item["module"], item["name"])
        item.update(tests=len(users[key]), passing=len(users[key] & passing), sites=sorted(sites[key]))
        item["blocked"] = sorted(users[key] & passing)
        names.append(item)
    paths = []
    for item in answer["paths"]:
        key = ("path", item["path"])
        item.update(tests=len(users[key]), passing=len(users[key] & passing), sites=sorted(sites[key]))
        item["blocked"] = sorted(users[key] & passing)
        paths.append(item)
    return {"names": names, "paths": paths}


# ---------------------------------------------------------------- (b) failures in the diagnostic run

_SIGNATURE = re.compile(
    r"unexpected keyword argument|positional argument|required (keyword-only |positional )?argument|"
    r"got multiple values|takes no arguments|object is not callable"
)
_WORDING = re.compile(r"Regex pattern did not match|does not match|not found in|Regex: |doesn't match")
_WHERE = re.compile(r"((?:core/drivetrain|plugins/[\w-]+/\w+)/[\w/]+\.py):(\d+)")


def classify(result: dict) -> tuple[str, str]:
    """(category, key) for a failed test from the diagnostic run."""
    text = f"{result.get('message', '')}\n{result.get('detail', '')}"
    if result.get("outcome") == "skipped":
        return "skipped here", result.get("message", "")[:200]
    missing = re.search(r"PeerMissingName: drivetrain lacks ([\w.]+)", text) or re.search(
        r"drivetrain lacks ([\w.]+)", text
    )
    if missing:
        return "missing name", missing.group(1)
    if (
        "Timeout" in text[:3000]
        and "+++ Timeout +++" in text
        or result.get("message", "").startswith("Failed: Timeout")
    ):
        return "timeout", "test timed out"
    lines = [line for line in text.splitlines() if re.match(r"^E\s+\w*(Error|Exception|Warning)\b", line)]
    error = lines[0][1:].strip() if lines else result.get("message", "").strip()
    attribute = re.search(r"'([\w.]+)' object has no attribute '(\w+)'|module '([\w.]+)' has no attribute '(\w+)'"
                          r"|type object '(\w+)' has no attribute '(\w+)'", error)  # fmt: skip
    if attribute:
        owner = attribute.group(1) or attribute.group(3) or attribute.group(5)
        name = attribute.group(2) or attribute.group(4) or attribute.group(6)
        category = "private internals" if name.startswith("_") else "missing attribute"
        return category, f"{owner}.{name}"
    enum_member = re.fullmatch(r"AttributeError: ([A-Z][A-Z0-9_]+)", error.strip())
    if enum_member:
        return "missing attribute", f"enum member {enum_member.group(1)}"
    if error.startswith("TypeError") and _SIGNATURE.search(error):
        return "signature", _normalise(error)
    quoted_in = re.match(r"(AssertionError: )?assert ['\"].*['\"] (not )?in ['\"]", error)
    if quoted_in or _WORDING.search(error) or _WORDING.search(result.get("message", "")):
        return "message wording", _normalise(error)
    return "behaviour", _normalise(error)


def _normalise(error: str) -> str:
    error = re.sub(r"0x[0-9a-f]+", "0x…", error)
    error = re.sub(r"/[\w/.-]+/(tmp|work)[\w/.-]*", "<path>", error)
    return error[:220]


def _where(result: dict) -> str:
    hits = _WHERE.findall(result.get("detail", ""))
    return f"{hits[-1][0].removeprefix('core/drivetrain/')}:{hits[-1][1]}" if hits else ""


def failure_gaps(reference: dict, diagnose: dict, ours: dict, missing: set[str]) -> dict:
    """Reference-passing tests that fail in the diagnostic run, grouped by (category, key)."""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    where: dict[tuple[str, str], Counter] = defaultdict(Counter)
    imports_fine: dict[tuple[str, str], int] = Counter()
    for file, data in reference.get("files", {}).items():
        if file not in diagnose.get("files", {}):
            # the diagnostic run did not run this file (or there is no diagnostic run stored: results are
            # git-ignored, so a fresh checkout has none): nothing is known about why its tests fail, and
            # counting them all "not collected" would fill the page with a non-result.
            continue
        diag_tests = diagnose["files"][file].get("tests", {})
        our_tests = ours.get("files", {}).get(file, {}).get("tests", {})
        for test_id, ref in data["tests"].items():
            if ref["outcome"] != "passed":
                continue
            result = diag_tests.get(test_id)
            if result is None:
                collection = diag_tests.get(f"{file}::<collection>")
                result = collection or {"outcome": "not collected"}
            if result["outcome"] in ("passed", "not applicable"):
                continue
            if result["outcome"] == "not collected":
                key = (
                    "not collected here",
                    "defined under a predicate drivetrain lacks or answers differently",
                )
            else:
                key = classify(result)
            if key[0] == "missing name":  # `X.keys` used on a missing X: the gap is X
                parts = key[1].split(".")
                for cut in range(len(parts), 1, -1):
                    if ".".join(parts[:cut]) in missing:
                        key = (key[0], ".".join(parts[:cut]))
                        break
            groups[key].append(test_id)
            where[key][_where(result)] += 1
            if test_id in our_tests:
                imports_fine[key] += 1
    return {"groups": groups, "where": where, "imports_fine": imports_fine}


# ---------------------------------------------------------------- the page


def _error_line(tail: str) -> str:
    """The last `SomeError: ...` line of a script's output, for a table cell."""
    lines = [
        line.strip()
        for line in tail.splitlines()
        if re.match(r"^\s*(\[rank\d+\]:\s*)?[\w.]*(Error|Exception|Missing\w*):", line)
    ]
    text = lines[-1] if lines else (tail.strip().splitlines() or [""])[-1]
    text = re.sub(r"^\[rank\d+\]:\s*", "", text)
    return "`" + _normalise(text).replace("|", "\\|").replace("`", "'")[:160] + "`"


def _env_names(work: Path) -> Counter:
    names: Counter = Counter()
    for path in list((work / "tests").glob("*.py")) + list((work / "test_utils").rglob("*.py")):
        for name in re.findall(r"ACCELERATE_[A-Z_]+", path.read_text(encoding="utf-8")):
            names[name] += 1
    return names


def render(static: dict, failures: dict, reference: dict, ours: dict, diagnose: dict, work: Path) -> str:
    out = ["# Gaps: what drivetrain lacks for the reference's tests", ""]
    out.append(
        "<!-- Generated by `scripts/peer --gaps` (peer/gaps.py) from the last `--all` run, the last `--all "
        "--diagnose` run and peer/reference_counts.json; edit those, not this page. -->\n"
    )
    ref_passing = sum(
        r["outcome"] == "passed" for f in reference["files"].values() for r in f["tests"].values()
    )
    kept = sum(
        ours.get("files", {}).get(file, {}).get("tests", {}).get(t, {}).get("outcome") == "passed"
        for file, f in reference["files"].items()
        for t, r in f["tests"].items()
        if r["outcome"] == "passed"
    )
    diag_kept = sum(
        diagnose.get("files", {}).get(file, {}).get("tests", {}).get(t, {}).get("outcome") == "passed"
        for file, f in reference["files"].items()
        for t, r in f["tests"].items()
        if r["outcome"] == "passed"
    )
    ref_scripts = reference.get("scripts", {})
    our_scripts = ours.get("scripts", {})
    out += [
        "## Where it stands",
        "",
        f"- Unit tests that pass on the reference ({reference.get('reference')}, this machine): **{ref_passing}**; "
        f"pass on drivetrain: **{kept}** ({ours.get('updated', 'not run')}).",
        (
            f"- With every missing name deferred to first use (diagnostic run, not a drop-in result): **{diag_kept}**"
            f" ({diagnose.get('updated', 'date unknown')})."
            if diagnose.get("files")
            else "- With every missing name deferred to first use: no diagnostic run stored here (run "
            "`scripts/peer --all --diagnose`, then `scripts/peer --gaps`); section (b) is empty until then."
        ),
        "",
        "| script (2 processes) | reference | drivetrain | drivetrain's error | with names deferred |",
        "|---|---|---|---|---|",
    ]
    diag_scripts = diagnose.get("scripts", {})
    for name in sorted(set(ref_scripts) | set(our_scripts)):
        mine = our_scripts.get(name, {})
        diag = diag_scripts.get(name, {})
        diag_cell = diag.get("outcome", "not run")
        if diag_cell == "failed":
            diag_cell = f"failed: {_error_line(diag.get('tail', ''))}"
        out.append(
            f"| `{name}` | {ref_scripts.get(name, {}).get('outcome', 'not run')} | {mine.get('outcome', 'not run')} "
            f"| {_error_line(mine.get('tail', '')) if mine.get('outcome') == 'failed' else ''} | {diag_cell} |"
        )
    out.append("")
    missing_names = [n for n in static["names"] if not n["ok"]]
    missing_paths = [p for p in static["paths"] if not p["ok"]]
    total_names = len(static["names"])
    out += [
        "## (a) Imports and module paths that do not resolve",
        "",
        f"{len(missing_names)} of the {total_names} distinct `(module, name)` imports the tests, the scripts and "
        f"test_utils make do not resolve on drivetrain; {sum(bool(n['elsewhere']) for n in missing_names)} of "
        f"those exist elsewhere in the package. {len(missing_paths)} of the {len(static['paths'])} module-path "
        "strings (mock.patch targets, logger names) do not resolve. *held back*: tests that pass on the "
        "reference and cannot run here until this resolves (a file-level import holds back the whole file; "
        "the names `drivetrain.test_utils` imports hold back every file that imports it). *sites*: where the "
        "import is written.",
        "",
    ]
    by_module: dict[str, list[dict]] = defaultdict(list)
    for item in missing_names:
        by_module[item["module"]].append(item)
    module_rank = sorted(
        by_module.items(), key=lambda kv: (-len(set().union(*[set(i["blocked"]) for i in kv[1]])), kv[0])
    )
    for module, items in module_rank:
        blocked = set().union(*[set(i["blocked"]) for i in items])
        out.append(f"### `{module}` — {len(items)} names, holding back {len(blocked)} tests\n")
        out.append("| names | held back | elsewhere in drivetrain | sites | why |")
        out.append("|---|---|---|---|---|")
        # Names that hold back the same tests from the same places share a row (the `is_*_available` family).
        rows: dict[tuple, list[dict]] = defaultdict(list)
        for item in items:
            rows[
                (
                    item["passing"],
                    tuple(item["sites"]),
                    tuple(item["elsewhere"]),
                    item["why"].split(" has no ")[0],
                )
            ].append(item)
        for (passing, sites, elsewhere, _), group in sorted(
            rows.items(), key=lambda kv: (-kv[0][0], kv[0][1])
        ):
            names = ", ".join(f"`{i['name']}`" for i in sorted(group, key=lambda i: i["name"]))
            where = ", ".join(f"`{m}`" for m in elsewhere) or "-"
            site_text = ", ".join(s.replace(f"{TEST_UTILS}.", "test_utils.") for s in sites[:4])
            if len(sites) > 4:
                site_text += f" +{len(sites) - 4}"
            why = group[0]["why"] if len(group) == 1 else "not in the module"
            out.append(f"| {names} | {passing} | {where} | {site_text} | {why[:90]} |")
        out.append("")
    out.append("### Module-path strings\n")
    out.append("| string | held back | sites | why |")
    out.append("|---|---|---|---|")
    for item in sorted(missing_paths, key=lambda i: (-i["passing"], i["path"])):
        out.append(
            f"| `{item['path']}` | {item['passing']} | {', '.join(item['sites'])} | {item['why'][:100]} |"
        )
    out.append("")
    env = _env_names(work)
    out.append("### Environment variables the tests set or read\n")
    out.append(
        "The rename leaves `ACCELERATE_*` names as they are (peer/README.md): a drop-in honours the variables "
        "its users already set. Occurrences in the tests and test_utils:\n"
    )
    out.append(", ".join(f"`{name}` ({n})" for name, n in env.most_common()) + "\n")

    groups, where, imports_fine = failures["groups"], failures["where"], failures["imports_fine"]
    by_category = Counter()
    for (category, _), tests in groups.items():
        by_category[category] += len(tests)
    out += [
        "## (b) Why tests fail once they import",
        "",
        "From the diagnostic run: every test that passes on the reference and fails on drivetrain with missing "
        "names deferred, by category (*missing name*: a name from (a) used at run time; *missing attribute*: "
        "a public attribute or enum member of an object that imports; *signature*: an argument the function "
        "does not take; *message wording*: the test matches an error, warning or log text; *behaviour*: "
        "anything else; *private internals*: an underscore attribute of the reference's objects; *skipped here*: "
        "a `require_*` decorator skips it here, through an `is_*_available` that drivetrain lacks or answers "
        "differently; *not collected here*: the class or parametrization is built under such a predicate).",
        "",
        "| category | tests |",
        "|---|---|",
    ]
    out += [f"| {category} | {n} |" for category, n in by_category.most_common()]
    out += [
        "",
        "### The 30 most impactful",
        "",
        "*tests*: reference-passing tests failing on this key in the diagnostic run (in brackets: of those, "
        "the ones whose file imports without the deferral, so they fail in the real run for this reason "
        "alone or after it). *where*: the innermost drivetrain frame most of them fail in.",
        "",
        "| # | category | key | tests | where | e.g. |",
        "|---|---|---|---|---|---|",
    ]
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    for rank, (key, tests) in enumerate(ranked[:30], 1):
        category, detail = key
        place = where[key].most_common(1)[0][0] if where[key] else ""
        example = sorted(tests)[0].split("::", 1)[1]
        detail = detail.replace("|", "\\|").replace("\n", " ")
        out.append(
            f"| {rank} | {category} | `{detail}` | {len(tests)} ({imports_fine[key]}) | {place or '-'} | "
            f"`{example}` |"
        )
    out.append("")
    out.append("### Failures that are not a missing name or a skip\n")
    out.append(
        "What is left once every name exists: signature, behaviour, wording, attributes, private internals, "
        "timeouts. *where* as above; *e.g.*: one failing test.\n"
    )
    out.append("| category | key | tests | where | e.g. |")
    out.append("|---|---|---|---|---|")
    for (category, detail), tests in ranked:
        if category in ("missing name", "skipped here", "not collected here"):
            continue
        place = where[(category, detail)].most_common(1)[0][0] if where[(category, detail)] else ""
        detail = detail.replace("|", "\\|").replace("\n", " ")
        out.append(f"| {category} | `{detail}` | {len(tests)} | {place or '-'} | `{sorted(tests)[0]}` |")
    out.append("")
    out.append("### Every failing test, by key\n")
    out.append("<details><summary>all keys</summary>\n")
    for key, tests in ranked:
        out.append(f"- **{key[0]}** `{key[1][:160]}`: " + ", ".join(f"`{t}`" for t in sorted(tests)))
    out.append("\n</details>\n")
    return "\n".join(out)


def write(cache: Path, python: Path) -> None:
    results = PEER / "results"
    reference = json.loads((PEER / "reference_counts.json").read_text())
    ours = (
        json.loads((results / "drivetrain.json").read_text())
        if (results / "drivetrain.json").is_file()
        else {}
    )
    diag_path = results / "diagnose.json"
    diagnose = json.loads(diag_path.read_text()) if diag_path.is_file() else {}
    work = source.prepare_work(cache, "drivetrain", folder="gaps")  # not the folder a run may be using
    static = static_gaps(work, reference, python)
    missing = {f"{n['module']}.{n['name']}" for n in static["names"] if not n["ok"]}
    missing |= {n["module"] for n in static["names"] if not n["ok"] and "does not import" in n["why"]}
    failures = failure_gaps(reference, diagnose, ours, missing)
    PAGE.write_text(render(static, failures, reference, ours, diagnose, work))
    results.mkdir(exist_ok=True)
    (results / "gaps.json").write_text(
        json.dumps(
            {"static": static, "failures": {f"{k[0]}: {k[1]}": v for k, v in failures["groups"].items()}},
            indent=1,
        )
    )
    print(
        f"peer: wrote {PAGE.relative_to(PEER.parent)} and {(results / 'gaps.json').relative_to(PEER.parent)}"
    )
