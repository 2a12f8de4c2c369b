import json
import subprocess
import sys

from exactpack.cli import main


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "exactpack.cli", *args], capture_output=True, text=True, check=False
    )


def test_demo_prints_the_fixture_trace_through_the_real_entry_point():
    proc = run_cli("demo")
    assert proc.returncode == 0, proc.stderr
    trace = json.loads(proc.stdout)
    assert [r["inputs"] for r in trace["rows"]] == [
        [0, 99, 100, 0, 101, -1],
        [0, 102, 103, 104, -1, -1],
    ]
    assert trace["key_ranges"][0][3:5] == [[3, 4], [3, 5]]
    assert trace["allowed_keys"][0][4] == [3, 4]
    assert trace["valid_targets"] == 9 and trace["cells"] == 12
    assert [o["source_id"] for o in trace["occurrences"]] == ["A", "B", "C"]
    assert trace["edges"]["tiled_equals_query_order"] is True


def test_bad_input_exits_2_with_one_line(capsys, monkeypatch):
    from exactpack.core.errors import InvalidInput
    from exactpack.verify import trace as demo

    def boom():
        raise InvalidInput("example 3 ('x'[0:9]) is bad — fix it")

    monkeypatch.setattr(demo, "demo_trace", boom)
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "exactpack demo: error: example 3 ('x'[0:9]) is bad — fix it"
    assert err.count("\n") == 1
