"""Read pytest's junit xml into {test id: result}. A test id is `tests/test_x.py::Class::test_name` (or
`tests/test_x.py::test_name`), the same on both sides, so outcomes can be compared test by test."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

COLLECTION = "<collection>"  # the pseudo-test pytest reports when a file fails to import


def _test_id(file: str, classname: str, name: str) -> str:
    module = Path(file).with_suffix("").as_posix().replace("/", ".")
    if classname == module or not classname:
        return f"{file}::{name}"
    if classname.startswith(module + "."):
        return f"{file}::{classname[len(module) + 1 :]}::{name}"
    return f"{file}::{classname.rsplit('.', 1)[-1]}::{name}"


def read(xml_path: Path, file: str) -> dict[str, dict]:
    """{test id: {"outcome": passed|failed|skipped, "message": one line, "detail": text, "seconds": float}}.
    A file that fails to import gives one entry under `file::<collection>`."""
    results: dict[str, dict] = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            outcome = "failed"
            message, detail = problem.get("message", ""), problem.text or ""
        elif skipped is not None:
            outcome = "skipped"
            message, detail = skipped.get("message", ""), ""
        else:
            outcome, message, detail = "passed", "", ""
        if not classname and problem is not None and "collect" in (message + detail).lower()[:2000]:
            test_id = f"{file}::{COLLECTION}"
        else:
            test_id = _test_id(file, classname, name)
        first_line = message.strip().splitlines()[0] if message.strip() else ""
        results[test_id] = {
            "outcome": outcome,
            "message": first_line[:400],
            "detail": detail[-6000:],
            "seconds": float(case.get("time", 0) or 0),
        }
    return results
