"""What the [aot] kernel step did, read from build output (imagebuild/flows/kernels/step.py): the step's own line as
BuildKit and buildah print it, lines that only look like it, and any text at all without a traceback."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from imagebuild.flows.kernels.step import KernelStepWatch, parse_progress, parse_seeded, parse_stats, progress_text, summary
from imagebuild.payload.probe.kernels.compile_resume import PROGRESS_MARK
from imagebuild.payload.probe.kernels.kernel_cache import SEED_MARK
from imagebuild.payload.probe.kernels.kernels_aot import STATS_MARK

STATS = {"compiled": 2, "reused": 5, "seconds": 41.5, "jobs": 2, "cache": "/var/cache/imagebuild/kernels",
         "peak_compile_rss_mb": 1800, "cache_after": {"bytes": 1, "removed": 0, "bound": 8}}


def test_the_steps_line_is_read_as_buildkit_and_buildah_print_it():
    line = STATS_MARK + json.dumps(STATS)
    for printed in (f"#17 212.4 {line}", line):
        assert parse_stats(printed) == {"compiled": 2, "reused": 5, "seconds": 41.5, "jobs": 2, "step": "ran"}


def test_lines_that_only_look_like_it_are_not_stats():
    for printed in ("#17 3.1 kernels: 2 compiled", STATS_MARK + "{not json", STATS_MARK + "[1, 2]",
                    STATS_MARK + json.dumps(dict(STATS, compiled=-1)), STATS_MARK + json.dumps(dict(STATS, jobs=True)),
                    STATS_MARK + json.dumps(dict(STATS, seconds="41")), STATS_MARK + json.dumps({"compiled": 1})):
        assert parse_stats(printed) is None, printed


def test_the_watch_passes_every_line_on_and_keeps_the_stats():
    seen = []
    watch = KernelStepWatch(seen.append)
    for printed in ("#1 [stage-0 1/3] FROM base", f"#9 1.0 {STATS_MARK}{json.dumps(STATS)}", "#10 DONE"):
        watch(printed)
    assert len(seen) == 3
    report = watch.report(lambda: 99)
    assert report["step"] == "ran" and report["compiled"] == 2
    assert summary(report) == "kernels: 2 compiled, 5 reused from the kernel cache, 41.5 s compiling (2 jobs)"


def test_a_step_that_did_not_run_reports_the_kernels_of_the_cached_layer():
    watch = KernelStepWatch(lambda _: None)
    watch("#9 CACHED")
    report = watch.report(lambda: 7)
    assert report == {"compiled": 0, "reused": 7, "seconds": 0.0, "jobs": None, "step": "cached"}
    assert "builder cache" in summary(report) and "7 kernels" in summary(report)


def test_the_compile_times_of_the_modules_compiled_are_kept_and_said():
    times = {"fused_moe_120": {"objects": 96, "cpu_s": 5400.0, "longest_s": 301.5},
             "fp4_quantization_120f": {"objects": 7, "cpu_s": 130.2, "longest_s": 70.0},
             "broken": {"objects": "96"}, "bad": [1]}
    report = parse_stats(STATS_MARK + json.dumps(dict(STATS, compile_times=times)))
    assert report["compile_times"] == {name: times[name] for name in ("fused_moe_120", "fp4_quantization_120f")}
    assert summary(report).endswith("; 103 objects, 92.2 CPU-minutes, the longest 302 s")
    assert "compile_times" not in parse_stats(STATS_MARK + json.dumps(dict(STATS, compile_times={"x": {}})))


def test_objects_resumed_from_an_interrupted_compile_are_said_and_nonsense_is_dropped():
    report = parse_stats(STATS_MARK + json.dumps(dict(STATS, resumed_objects=40)))
    assert report["resumed_objects"] == 40
    assert summary(report).endswith("; 40 objects came from an interrupted compile of the same kernels")
    for nonsense in (0, -3, True, "40", 4.5, None):
        report = parse_stats(STATS_MARK + json.dumps(dict(STATS, resumed_objects=nonsense)))
        assert "resumed_objects" not in report and "interrupted" not in summary(report)


def test_cached_kernels_that_were_not_their_recorded_bytes_are_said_and_nonsense_is_dropped():
    rejected = [{"kind": "flashinfer", "name": "sampling", "key": "a" * 64, "problem": "sha256 1, entry.json states 2"}]
    report = parse_stats(STATS_MARK + json.dumps(dict(STATS, rejected=rejected)))
    assert report["rejected"] == [{"kind": "flashinfer", "name": "sampling", "problem": "sha256 1, entry.json states 2"}]
    assert summary(report).endswith("; 1 cached kernels were not the bytes their entries record and were compiled "
                                    "again: flashinfer sampling (sha256 1, entry.json states 2)")
    for nonsense in (3, "x", {"kind": "a"}, [{"kind": 1, "name": "n", "problem": "p"}], [5], None, []):
        report = parse_stats(STATS_MARK + json.dumps(dict(STATS, rejected=nonsense)))
        assert "rejected" not in report and "compiled again" not in summary(report)


@given(st.text())
def test_any_line_ends_in_stats_or_none(text):
    for printed in (text, STATS_MARK + text, f"#3 0.2 {STATS_MARK}{text}"):
        result = parse_stats(printed)
        assert result is None or (set(result) - {"compile_times", "resumed_objects", "rejected"}
                                  == {"compiled", "reused", "seconds", "jobs", "step"})


@given(st.dictionaries(st.sampled_from(["compiled", "reused", "seconds", "jobs", "x", "compile_times",
                                        "resumed_objects", "rejected"]),
                       st.recursive(st.one_of(st.integers(), st.floats(allow_nan=True), st.booleans(), st.none(),
                                              st.text()),
                                    lambda inner: st.dictionaries(st.text(max_size=8), inner, max_size=3)
                                    | st.lists(inner, max_size=3), max_leaves=8)))
def test_any_json_object_ends_in_stats_or_none(value):
    result = parse_stats(STATS_MARK + json.dumps(value))
    if result is not None:
        assert result["compiled"] >= 0 and result["seconds"] >= 0
        summary(result)


SEEDED = {"flashinfer": 9, "sglang": 4, "present": 1, "refused": 0}


def test_the_seed_builds_line_is_read_and_said_in_the_summary():
    assert parse_seeded(f"#5 0.4 {SEED_MARK}{json.dumps(SEEDED)}") == SEEDED
    for printed in ("#5 0.4 seeded 9", SEED_MARK + "{", SEED_MARK + json.dumps(dict(SEEDED, sglang=-1)),
                    SEED_MARK + json.dumps(dict(SEEDED, present=False)), SEED_MARK + json.dumps({"flashinfer": 1})):
        assert parse_seeded(printed) is None, printed
    report = {"compiled": 0, "reused": 13, "seconds": 0.0, "jobs": 2, "step": "ran",
              "seeded": {"taken": [{"source": "localhost:5000/team/x:buildcache"}], "added": SEEDED}}
    assert summary(report).endswith("; the kernel cache took 9 FlashInfer and 4 SGLang entries (1 already there) "
                                    "from the kernel layer of localhost:5000/team/x:buildcache")
    two = dict(report, seeded={**report["seeded"], "taken": [{"source": "r/x:a"}, {"source": "r/y:b"}]})
    assert summary(two).endswith("from the kernel layers of r/x:a, r/y:b")
    assert "took" not in summary(dict(report, seeded={"taken": [], "added": None, "tried": []}))


@given(st.text())
def test_any_line_ends_in_seed_counts_or_none(text):
    for printed in (text, SEED_MARK + text):
        result = parse_seeded(printed)
        assert result is None or set(result) == set(SEEDED)


def progress_line(**event) -> str:
    return f"#12 61.3 {PROGRESS_MARK}{json.dumps(event)}"


def test_each_modules_progress_is_a_line_of_its_own_and_the_report_keeps_the_last():
    seen = []
    watch = KernelStepWatch(seen.append)
    for printed in (progress_line(kind="flashinfer", name="cascade", state="reused", seconds=0.0),
                    progress_line(kind="flashinfer", name="sampling", state="compiling", objects_done=1, objects=3,
                                  seconds=20.4),
                    progress_line(kind="flashinfer", name="sampling", state="compiled", objects_done=3, objects=3,
                                  seconds=61.2),
                    progress_line(kind="sglang", name="sm120f/rope", state="compiled", seconds=None),
                    f"#12 70.0 {STATS_MARK}{json.dumps(STATS)}"):
        watch(printed)
    assert [line for line in seen if not line.startswith("#")] == [
        "kernel cascade (flashinfer): reused from the kernel cache",
        "kernel sampling (flashinfer): compiling, 1 of 3 objects, 20 s",
        "kernel sampling (flashinfer): compiled, 3 of 3 objects, 61 s",
        "kernel sm120f/rope (sglang): compiled"]
    assert len([line for line in seen if line.startswith("#")]) == 5  # every build line is passed on too
    modules = watch.report(lambda: 0)["modules"]
    assert [(m["name"], m["state"], m.get("objects_done")) for m in modules] == [
        ("cascade", "reused", None), ("sampling", "compiled", 3), ("sm120f/rope", "compiled", None)]


def test_lines_that_only_look_like_progress_are_not_progress():
    for printed in (PROGRESS_MARK + "{", PROGRESS_MARK + "[]", progress_line(kind="cuda", name="x", state="reused"),
                    progress_line(kind="flashinfer", name="", state="reused"),
                    progress_line(kind="flashinfer", name="x", state="done"),
                    progress_line(kind="flashinfer", name=3, state="reused")):
        assert parse_progress(printed) is None, printed
    odd = parse_progress(progress_line(kind="flashinfer", name="x", state="compiling", objects_done=True, objects=3,
                                       seconds=-1))
    assert odd == {"kind": "flashinfer", "name": "x", "state": "compiling"}  # the nonsense fields are dropped


@given(st.text())
def test_any_line_ends_in_progress_or_none(text):
    for printed in (text, PROGRESS_MARK + text):
        event = parse_progress(printed)
        assert event is None or progress_text(event).startswith("kernel ")


@given(st.dictionaries(st.sampled_from(["kind", "name", "state", "objects_done", "objects", "seconds", "x"]),
                       st.one_of(st.sampled_from(["flashinfer", "sglang", "reused", "compiling", "compiled"]),
                                 st.integers(), st.floats(allow_nan=True), st.booleans(), st.none(), st.text())))
def test_any_json_object_ends_in_progress_or_none(value):
    event = parse_progress(PROGRESS_MARK + json.dumps(value))
    assert event is None or progress_text(event).startswith(f"kernel {event['name']} ({event['kind']}): ")


def test_with_json_progress_each_module_is_an_event_a_tool_reads(capsys):
    """--json's progress (cli/output.py JsonProgress): every stderr line is one JSON object; a module's progress is
    {"event": "kernel", ...} with its counts, a build line is {"progress": TEXT}, printed literally."""
    import io
    from imagebuild.cli.output import JsonProgress
    stream = io.StringIO()
    watch = KernelStepWatch(JsonProgress(stream))
    watch(progress_line(kind="flashinfer", name="sampling", state="compiling", objects_done=1, objects=3, seconds=20.4))
    watch("#12 70.0 [red]not markup[/red]")
    lines = [json.loads(text) for text in stream.getvalue().splitlines()]
    assert lines[0] == {"event": "kernel", "kind": "flashinfer", "name": "sampling", "state": "compiling",
                        "objects_done": 1, "objects": 3, "seconds": 20.4}
    assert lines[1]["progress"].endswith(PROGRESS_MARK + json.dumps(
        {"kind": "flashinfer", "name": "sampling", "state": "compiling", "objects_done": 1, "objects": 3, "seconds": 20.4}))
    assert lines[2] == {"progress": "#12 70.0 [red]not markup[/red]"}


def test_the_triton_kernels_seeded_are_said_and_nonsense_is_dropped():
    report = parse_stats(STATS_MARK + json.dumps(dict(STATS, triton={"kernels": 3, "seconds": 21.4})))
    assert report["triton"] == {"kernels": 3, "seconds": 21.4}
    assert summary(report).endswith("; 3 Triton kernels of the forward compiled into Triton's cache (21.4 s)")
    for nonsense in (None, {}, {"kernels": -1, "seconds": 2}, {"kernels": 3, "seconds": "2"}, [3], {"kernels": True,
                                                                                                      "seconds": 1}):
        report = parse_stats(STATS_MARK + json.dumps(dict(STATS, triton=nonsense)))
        assert "triton" not in report and "Triton" not in summary(report)
