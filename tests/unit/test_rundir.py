"""The one reader of a run directory: records, status, rows."""
from __future__ import annotations

import pytest

from paramserver.rundir.layout import RunDir
from paramserver.rundir.lock import RunDirError
from paramserver.rundir.summary import write_result


def test_records_status_and_rows(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    assert run.summary() == {} and run.status() is None and run.rows("clients") == []
    write_result(run, "complete", {"test_error": 0.1}, 1.0, "wall", {})
    with run.writer("clients") as log:
        log.write_many([{"client": 0, "step": 1}, {"client": 0, "step": 2}])
    assert run.status() == "complete" and [r["step"] for r in run.rows("clients")] == [1, 2]


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_a_damaged_record_is_refused_in_one_line_and_has_no_status(tmp_path, text):
    run = RunDir(tmp_path)
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(RunDirError, match="summary.json"):
        run.summary()
    assert run.status() is None
