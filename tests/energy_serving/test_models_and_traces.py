"""GPU latency/power model (fit, energy valley), profiler table, and trace loaders on real files."""

import numpy as np
import pytest

from systems.common.gpu_model import StageModel
from systems.energy_serving.power_fit import fit_mem_beta, fit_perseus
from systems.energy_serving.profiler import build_table, sample_points, sim_measure, table_error
from workloads.serving import TraceError, load_azure, load_mooncake, load_servegen


@pytest.fixture
def a100_70b(compose_cfg):
    cfg = compose_cfg("system=beam")
    return cfg, StageModel(cfg.model, cfg.hardware, 2, 4)


@pytest.mark.full_data("gpu_power/")
def test_power_fit_reproduces_the_profile(compose_cfg, full_data):
    """Both Perseus profiles give the a100-80gb profile's power terms (1 %)."""
    cfg = compose_cfg("system=beam")
    fit = fit_perseus(full_data / "gpu_power")
    pw = cfg.hardware.power
    assert fit["n_rows"] == 1216
    assert fit["act_a_w"] == pytest.approx(pw.act_a_w, rel=0.01)
    assert fit["act_b_w"] == pytest.approx(pw.act_b_w, rel=0.01)
    assert fit["act_alpha"] == pytest.approx(pw.act_alpha, abs=0.05)
    assert fit["power_mape_pct"] < 5.0 and fit["time_mape_pct"] < 2.0


def test_power_fit_on_one_profile_and_mem_beta_on_the_h100_configurations(compose_cfg):
    """The fixture slices (the GPT-3 Perseus profile, ML.ENERGY's 11 single-H100 Llama-3.1-8B chat
    configurations): the GPT-3 profile alone fits within 3 % of the profile's power terms, and
    ``mem_beta`` comes out as the a100-80gb profile records it. Mutations caught: the per-GPU power
    taken from another column (energy per token), the configurations not restricted to one GPU."""
    from tests.conftest import FIXTURE_DATA

    pw = compose_cfg("system=beam").hardware.power
    fit = fit_perseus(FIXTURE_DATA / "gpu_power")
    assert fit["n_rows"] == 608
    assert fit["act_a_w"] == pytest.approx(pw.act_a_w, rel=0.03)
    assert fit["act_b_w"] == pytest.approx(pw.act_b_w, rel=0.03)
    assert fit["act_alpha"] == pytest.approx(pw.act_alpha, abs=0.1)
    h = compose_cfg("hardware=h100", "model=llama-3.1-8b", "system=beam")
    mb = fit_mem_beta(FIXTURE_DATA / "gpu_power", h.model, h.hardware)
    assert mb["n_configs"] == 11
    assert mb["mem_beta"] == pytest.approx(pw.mem_beta, abs=0.01)
    assert mb["power_mape_pct"] < 8.0


def test_energy_valley_exists_and_moves_with_batch(a100_70b):
    _, st = a100_70b
    cl = st.clocks(15)
    v16, v512 = st.energy_valley(16, cl), st.energy_valley(512, cl)
    assert cl[0] < v16 < cl[-1] and cl[0] < v512 < cl[-1]  # U-shaped: interior minimum
    assert v16 < v512 - 100  # memory-bound valley sits lower
    _, e = st.step(512, cl)
    assert e[0] > e.min() * 1.2 and e[-1] > e.min() * 1.2


def test_scalar_step_equals_vectorised(a100_70b):
    _, st = a100_70b
    for n, f, ctx in [(1, 1410.0, 500.0), (70, 630.0, 9000.0), (2048, 900.0, 2048.0)]:
        lv, ev = st.step(n, f, ctx, ctx)
        ls, es = st.step1(n, f, ctx, ctx)
        assert ls == pytest.approx(float(lv)) and es == pytest.approx(float(ev))


def test_latency_compute_part_scales_with_one_over_f(a100_70b):
    _, st = a100_70b
    t_sm1, t_mem1, _ = st.parts(2048, 1410.0)
    t_sm2, t_mem2, _ = st.parts(2048, 705.0)
    assert t_sm2 == pytest.approx(2 * t_sm1) and t_mem2 == pytest.approx(t_mem1)


def test_profiler_is_sparse_tile_quantised_and_accurate(a100_70b):
    cfg, st = a100_70b
    pts = sample_points(64, 512, [128, 256, 512, 1024, 2048], 2304)
    assert pts == [1, 64, 128, 192, 256, 320, 384, 448, 512, 1024, 2048, 2304]
    cl = st.clocks(15)
    measure = sim_measure(st, ctx=512.0, small_max=512)
    T = build_table(measure, cl, st.idle_power(cl), 2304, 64, 512, [128, 256, 512, 1024, 2048])
    assert T.L.shape == (2305, 81)
    assert np.all(np.diff(T.L[1:], axis=1) <= 1e-15)  # non-increasing in the clock
    # exact on tile ends, small error elsewhere
    L, _ = T.rows(np.array([256]))
    lat, _ = measure(np.array([[256]]), cl[None, :])
    assert np.allclose(L[0], lat[0])
    err = table_error(T, measure, range(1, 2305, 5))
    assert err["latency_mape_pct"] < 5.0


@pytest.mark.full_data("traces/azure_llm_2023/")
@pytest.mark.parametrize("name,rows,span,rate", [("code", 8819, 3436, 2.57), ("conv", 19366, 3502, 5.53)])
def test_azure_trace_as_its_readme_states(full_data, name, rows, span, rate):
    r = load_azure(full_data / "traces/azure_llm_2023" / f"AzureLLMInferenceTrace_{name}.csv")
    assert len(r) == rows
    assert r.span_s == pytest.approx(span, abs=1.0)
    assert r.mean_rate == pytest.approx(rate, abs=0.01)


@pytest.mark.parametrize(
    "name,rows,span,rate,inp", [("conversation", 12031, 3537.0, 3.40, 12035), ("synthetic", 3993, 1022.0, 3.91, 15325)]
)
@pytest.mark.full_data("traces/mooncake/")
def test_mooncake_trace_as_its_readme_states(full_data, name, rows, span, rate, inp):
    r = load_mooncake(full_data / "traces/mooncake" / f"{name}_trace.jsonl")
    assert len(r) == rows and r.span_s == pytest.approx(span, abs=1.0)
    assert r.mean_rate == pytest.approx(rate, abs=0.01)
    assert r.input_len.mean() == pytest.approx(inp, abs=1)


def test_servegen_segment_scaled_to_target_tokens(each_trace_data):
    r = load_servegen(
        each_trace_data / "traces/servegen/language/m-large", 68400, 3600, 1800.0, np.random.default_rng(0)
    )
    tok_rate = (r.input_len.sum() + r.output_len.sum()) / 3600
    assert 1800 * 0.7 < tok_rate < 1800 * 1.3  # bursty: realised rate is near target
    assert r.arrival_s.min() >= 0 and r.arrival_s.max() < 3600
    assert np.all(np.diff(r.arrival_s) >= 0)


def test_missing_traces_name_the_file(tmp_path):
    with pytest.raises(TraceError, match="absent.csv: trace file not found"):
        load_azure(tmp_path / "absent.csv")
    with pytest.raises(TraceError, match="absent.jsonl: trace file not found"):
        load_mooncake(tmp_path / "absent.jsonl")
    with pytest.raises(TraceError, match="no chunk-.*-trace.csv files"):
        load_servegen(tmp_path, 0, 600, 0.0, np.random.default_rng(0))


AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9800000,10,2\n"
MOON_HEAD = '{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
SG_OK_ROW = "0,0.5,1.0,Gamma,0.8,2.0\n"
SG_DATASET = '{\n  "0": {\n    "input_tokens": "{5: 0.5, 9: 0.5}",\n    "output_tokens": "%s"\n  }\n}\n'

BAD_TRACES = [  # (loader, file name, content, message: file:line: field ...)
    (
        "azure",
        "t.csv",
        AZURE_HEAD + "2023-11-16 18:17:04.0000000,10,-3\n",
        r"t\.csv:3: GeneratedTokens='-3' is out of range: a token count >= 1",
    ),
    (
        "azure",
        "t.csv",
        AZURE_HEAD + "2023-11-16 18:17:04.0000000,0,5\n",
        r"t\.csv:3: ContextTokens='0' is out of range: a token count >= 1",
    ),
    (
        "azure",
        "t.csv",
        AZURE_HEAD + "2023-11-16 18:17:04.0000000,ten,2\n",
        r"t\.csv:3: ContextTokens='ten' is not a whole number of tokens",
    ),
    (
        "azure",
        "t.csv",
        AZURE_HEAD + "2023-11-16 18:17:04.0000000,12.5,2\n",
        r"t\.csv:3: ContextTokens='12\.5' is not a whole number of tokens",
    ),
    ("azure", "t.csv", AZURE_HEAD + "16/11/2023 18:17,10,2\n", r"t\.csv:3: TIMESTAMP='16/11/2023 18:17' is not"),
    ("azure", "t.csv", AZURE_HEAD + "2023-11-16 18:17:03.0000000,10,2\n", r"t\.csv:3: TIMESTAMP earlier than"),
    (
        "mooncake",
        "m.jsonl",
        MOON_HEAD + '{"timestamp": 5, "input_length": 0, "output_length": 3}\n',
        r"m\.jsonl:2: input_length=0 is out of range: a token count >= 1",
    ),
    (
        "mooncake",
        "m.jsonl",
        MOON_HEAD + '{"timestamp": 5, "input_length": 7, "output_length": -1}\n',
        r"m\.jsonl:2: output_length=-1 is out of range",
    ),
    (
        "mooncake",
        "m.jsonl",
        MOON_HEAD + '{"timestamp": 5, "input_length": 7.5, "output_length": 3}\n',
        r"m\.jsonl:2: input_length=7\.5 is not a whole number of tokens",
    ),
    (
        "mooncake",
        "m.jsonl",
        MOON_HEAD + '{"timestamp": 5, "input_length": true, "output_length": 3}\n',
        r"m\.jsonl:2: input_length=True is not a whole number of tokens",
    ),
    (
        "mooncake",
        "m.jsonl",
        MOON_HEAD + '{"timestamp": NaN, "input_length": 7, "output_length": 3}\n',
        r"m\.jsonl:2: timestamp=nan is out of range: milliseconds >= 0",
    ),
    (
        "mooncake",
        "m.jsonl",
        '{"timestamp": -5, "input_length": 7, "output_length": 3}\n',
        r"m\.jsonl:1: timestamp=-5 is out of range",
    ),
    ("mooncake", "m.jsonl", MOON_HEAD + '{"timestamp": 5}\n', r"m\.jsonl:2: not a request object"),
    (
        "servegen",
        "chunk-7-trace.csv",
        SG_OK_ROW + "600,-0.2,1.0,Gamma,0.8,2.0\n",
        r"chunk-7-trace\.csv:2: rate='-0\.2' is out of range: a finite number >= 0",
    ),
    (
        "servegen",
        "chunk-7-trace.csv",
        SG_OK_ROW + "600,0.2,nan,Gamma,0.8,2.0\n",
        r"chunk-7-trace\.csv:2: cv='nan' is out of range",
    ),
    (
        "servegen",
        "chunk-7-trace.csv",
        SG_OK_ROW + "600,0.2,1.0,Poisson,0.8,2.0\n",
        r"chunk-7-trace\.csv:2: pattern='Poisson' is not allowed: Gamma, Weibull or empty",
    ),
    (
        "servegen",
        "chunk-7-trace.csv",
        SG_OK_ROW + "600,0.2,1.0,Weibull,0,2.0\n",
        r"chunk-7-trace\.csv:2: shape='0' is out of range: > 0 in an active Weibull window",
    ),
    ("servegen", "chunk-7-trace.csv", "0,abc,1.0,Gamma,0.8,2.0\n", r"chunk-7-trace\.csv:1: rate='abc' is not a number"),
    (
        "servegen",
        "chunk-7-dataset.json",
        SG_DATASET.replace("{5: 0.5", "{0: 0.5") % "{3: 1.0}",
        r"chunk-7-dataset\.json:3: window 0 input_tokens: token count 0 is out of range: >= 1",
    ),
    (
        "servegen",
        "chunk-7-dataset.json",
        SG_DATASET % "{-2: 0.5, 3: 0.5}",
        r"chunk-7-dataset\.json:4: window 0 output_tokens: token count -2 is out of range: >= 0",
    ),
    (
        "servegen",
        "chunk-7-dataset.json",
        SG_DATASET % "{2: -0.5, 3: 1.5}",
        r"chunk-7-dataset\.json:4: window 0 output_tokens: probability -0\.5 of 2 tokens is out of range",
    ),
    (
        "servegen",
        "chunk-7-dataset.json",
        SG_DATASET % "{2: 0.0, 3: 0.0}",
        r"chunk-7-dataset\.json:4: window 0 output_tokens: probability 0\.0 of 2 tokens is out of range",
    ),
    (
        "servegen",
        "chunk-7-dataset.json",
        SG_DATASET % "{2: 0.5, 3: oops}",
        r"chunk-7-dataset\.json:4: window 0 output_tokens: not a dict-literal PDF",
    ),
    ("servegen", "chunk-7-dataset.json", '["not", "a", "dataset"]', r"chunk-7-dataset\.json: not a ServeGen dataset"),
]


def write_bad_trace(tmp_path, loader, name, content):
    """The bad file, plus valid companions for ServeGen (a client folder needs both files)."""
    (tmp_path / name).write_text(content)
    if loader == "servegen":
        (tmp_path / "chunk-7-trace.csv").exists() or (tmp_path / "chunk-7-trace.csv").write_text(SG_OK_ROW)
        (tmp_path / "chunk-7-dataset.json").exists() or (tmp_path / "chunk-7-dataset.json").write_text(
            SG_DATASET % "{3: 1.0}"
        )
    return tmp_path / name if loader != "servegen" else tmp_path


def load(loader, path):
    if loader == "servegen":
        return load_servegen(path, 0, 600, 0.0, np.random.default_rng(0))
    return (load_azure if loader == "azure" else load_mooncake)(path)


@pytest.mark.parametrize("loader,name,content,match", BAD_TRACES, ids=[f"{b[0]}-{b[3][:40]}" for b in BAD_TRACES])
def test_out_of_range_trace_values_name_file_line_and_field(tmp_path, loader, name, content, match):
    """Every loader refuses a value out of range, naming file:line and the field. Mutations caught:
    dropping the >= 1 check (GeneratedTokens=-3 and ContextTokens=0 are read), int() truncating 7.5,
    the ServeGen PDF check reading keys as probabilities (wrong field named)."""
    with pytest.raises(TraceError, match=match):
        load(loader, write_bad_trace(tmp_path, loader, name, content))


def test_valid_small_traces_load(tmp_path):
    """The companions of the bad files above are themselves valid (so each bad case fails on its line)."""
    a = tmp_path / "a.csv"
    a.write_text(AZURE_HEAD + "2023-11-16 18:17:05.4800000,1,1\n")
    assert load_azure(a).arrival_s.tolist() == pytest.approx([0.0, 1.5])
    m = tmp_path / "m.jsonl"
    m.write_text(MOON_HEAD + '{"timestamp": 2500, "input_length": 7.0, "output_length": 3}\n')
    assert load_mooncake(m).input_len.tolist() == [5, 7]
    write_bad_trace(tmp_path, "servegen", "chunk-7-dataset.json", SG_DATASET % "{0: 0.5, 3: 0.5}")
    r = load(loader="servegen", path=tmp_path)
    assert len(r) > 100 and set(r.input_len) == {5, 9} and set(r.output_len) <= {1, 3}
    assert f"{int((r.output_len == 1).sum())} requests drawn with 0 output tokens served as 1" in r.note


@pytest.mark.parametrize(
    "workload,name,content",
    [
        ("azure_code", "t.csv", BAD_TRACES[0][2]),
        ("mooncake", "m.jsonl", BAD_TRACES[6][2]),
        ("servegen", "chunk-7-trace.csv", BAD_TRACES[13][2]),
    ],
)
def test_bad_trace_value_stops_the_run_before_work(compose_cfg, tmp_path, workload, name, content):
    """The TraceError reaches the user as ConfigError (exit 2 in run.py) before any record is written."""
    from harness.errors import ConfigError
    from harness.run import run

    path = write_bad_trace(tmp_path, workload.split("_")[0], name, content)
    cfg = compose_cfg(
        "system=beam",
        f"workload={workload}",
        f"workload.path={path}",
        "workload.start_s=0",
        output_dir=tmp_path / "out",
    )
    with pytest.raises(ConfigError, match=f"workload '{workload}': .*{name}:\\d+: "):
        run(cfg)
    assert not (tmp_path / "out").exists()


# Local wall-clock rows across both daylight-saving changes the test's zones see in autumn 2023:
# Sydney starts DST on 2023-10-01 (02:00 -> 03:00), Chicago ends it on 2023-11-05 (01:00-02:00 twice).
DST_TRACE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-10-01 01:30:00.0000000,10,2
2023-10-01 02:30:00.0000000,10,2
2023-10-01 03:30:00.0000000,10,2
2023-11-05 01:30:00.0000000,10,2
2023-11-05 01:59:59.5000000,10,2
2023-11-05 02:00:00.0000000,10,2
2023-11-05 02:30:00.0000000,10,2
"""
DAY = 86400.0
DST_ARRIVALS_UTC = [0.0, 3600.0, 7200.0, 35 * DAY, 35 * DAY + 1799.5, 35 * DAY + 1800.0, 35 * DAY + 3600.0]
REPLAY = """
import json, sys, types
from workloads.serving import build_requests
w = types.SimpleNamespace(kind="trace", format="azure", path=sys.argv[1], time_scale=1.0, start_s=0.0,
                          duration_s=1e9, max_requests=None, max_input_len=8192, seed=0)
print(json.dumps(build_requests(w).arrival_s.tolist()))
"""


def test_azure_arrivals_do_not_depend_on_the_host_time_zone(tmp_path):
    """Naive Azure timestamps are UTC: the replayed arrivals are the same under TZ=UTC,
    America/Chicago and Australia/Sydney, and equal the UTC differences. Mutation caught: reading
    them as local time (``datetime.strptime(...).timestamp()``, the old code): Chicago puts an hour
    between 01:59:59.5 and 02:00, Sydney none between 02:30 (which does not exist there) and 03:30."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "dst.csv"
    path.write_text(DST_TRACE)
    root = Path(__file__).resolve().parents[2]
    got = {}
    for tz in ("UTC", "America/Chicago", "Australia/Sydney"):
        out = subprocess.run(
            [sys.executable, "-c", REPLAY, str(path)],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, TZ=tz, PYTHONPATH=str(root)),
        )
        assert out.returncode == 0, out.stderr
        got[tz] = json.loads(out.stdout)
    for tz, arrivals in got.items():
        assert arrivals == pytest.approx(DST_ARRIVALS_UTC, abs=1e-6), tz


def _readers(data):
    """(vectorised reader, line reader, file) for every trace file in the data folder ``data``."""
    from workloads import serving as ws

    tr = data / "traces"
    out = [(ws._azure_fast, ws._azure_by_line, p) for p in sorted((tr / "azure_llm_2023").glob("*.csv"))]
    out += [(ws._mooncake_fast, ws._mooncake_by_line, p) for p in sorted((tr / "mooncake").glob("*.jsonl"))]
    for root in sorted((tr / "servegen").glob("*/*")):
        out += [
            (ws._servegen_trace_fast, ws._servegen_trace_by_line, p) for p in sorted(root.glob("chunk-*-trace.csv"))
        ]
        out += [
            (ws._servegen_dataset_fast, ws._servegen_dataset_by_line, p)
            for p in sorted(root.glob("chunk-*-dataset.json"))
        ]
    return out


def _flat(x):
    """Nested tuples / dicts of arrays as one list of (path, array) for comparison."""
    if isinstance(x, dict):
        return [(f"{k}/{p}", a) for k in sorted(x) for p, a in _flat(x[k])]
    if isinstance(x, tuple):
        return [(f"{i}/{p}", a) for i, v in enumerate(x) for p, a in _flat(v)]
    return [("", np.asarray(x))]


def test_vectorised_readers_read_every_trace_as_the_line_readers_do(each_trace_data):
    """Every shared trace file (Azure, Mooncake, every ServeGen client's windows and PDFs) is taken by
    the vectorised reader as is (no fall-back) and gives the line reader's arrays bit for bit, in
    the same order. Mutations caught: Azure timestamps rounded to the microsecond (datetime
    truncates); the PDF probabilities read off by one (keys and values swapped); Mooncake
    timestamps left in ms."""
    readers = _readers(each_trace_data)
    assert len(readers) >= 18  # the fixture slices; the full folder has over 300
    for fast, by_line, path in readers:
        a, b = _flat(fast(path)), _flat(by_line(path))
        assert [p for p, _ in a] == [p for p, _ in b], path
        for (p, x), (_, y) in zip(a, b):
            assert x.dtype == y.dtype and np.array_equal(x, y), (path, p)


def test_azure_seventh_digit_truncated_as_datetime_does(tmp_path):
    """Azure timestamps carry 7 fractional digits; datetime keeps 6 (truncated), and so does the
    vectorised reader. Mutation caught: rounding to the microsecond (the shared files' 7th digit is
    always 0, so only this file shows it)."""
    from workloads import serving as ws

    p = tmp_path / "t.csv"
    p.write_text(AZURE_HEAD + "2023-11-16 18:17:04.9999995,10,2\n")
    fast, by_line = ws._azure_fast(p), ws._azure_by_line(p)
    assert fast[0].tolist() == by_line[0].tolist() and by_line[0][1] % 1 == pytest.approx(0.999999, abs=1e-7)


def test_servegen_trace_files_read_in_one_parse_as_file_by_file(each_trace_data, monkeypatch):
    """Every shared ServeGen folder's trace CSVs, joined and parsed once, split back into each file's
    windows bit for bit as the file-by-file reader gives them (no fall-back). Mutations caught: the
    split points shifted by one file (``np.cumsum(rows)[1:]``); a file's last line dropped from its
    row count."""
    from workloads import serving as ws

    for root in sorted((each_trace_data / "traces" / "servegen").glob("*/*")):
        paths = sorted(root.glob("chunk-*-trace.csv"))
        want = [ws._read(ws._servegen_trace_fast, ws._servegen_trace_by_line, p) for p in paths]
        with monkeypatch.context() as m:
            m.setattr(ws, "_read", lambda *a: pytest.fail("fell back to file-by-file reading"))
            got = ws._servegen_traces(paths)
        assert len(got) == len(want) >= 2
        for p, g, w in zip(paths, got, want):
            assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(g, w)), p


def test_servegen_trace_files_whose_lines_and_rows_differ_are_read_one_by_one(tmp_path):
    """A blank line (pyarrow skips it) in one file and a lone carriage return (pyarrow ends a row
    there) in the next would cancel in the joined row count and shift every window after them: such
    files are read one by one.
    Mutation caught: the lone-\\r check dropped (the second file gets the first one's last window)."""
    from workloads import serving as ws

    rows = ["0,0.5,1.0,Gamma,0.8,2.0", "600,0.25,1.0,Weibull,0.5,1.0", "1200,0,0,,0,0", "1800,0.1,2.0,Gamma,1.5,3.0"]
    files = {
        "chunk-1-trace.csv": f"{rows[0]}\n\n{rows[1]}\n",
        "chunk-2-trace.csv": f"{rows[2]}\r{rows[3]}\n",
        "chunk-3-trace.csv": f"{rows[1]}\r\n{rows[0]}",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text, newline="")
    paths = sorted(tmp_path.glob("*.csv"))
    got = ws._servegen_traces(paths)
    want = [ws._read(ws._servegen_trace_fast, ws._servegen_trace_by_line, p) for p in paths]
    assert [g[0].tolist() for g in got] == [[0, 600], [1200, 1800], [600, 0]]
    for g, w in zip(got, want):
        assert all(np.array_equal(a, b) for a, b in zip(g, w))


def test_servegen_pdfs_are_read_per_window_when_a_run_reads_them(tmp_path):
    """A dataset's window is parsed when a segment reads it: a PDF only the line reader takes (a
    trailing comma) is read as it reads it; a bad PDF in a window the segment does not read stops
    nothing, and stops the segment that reads it (TraceError naming file:line, window, field).
    Mutations caught: no fall-back per window (the trailing comma fails); every window parsed up
    front (the first segment fails)."""
    from workloads import serving as ws

    (tmp_path / "chunk-7-trace.csv").write_text("0,0.5,1.0,Gamma,0.8,2.0\n21600,0.5,1.0,Gamma,0.8,2.0\n")
    (tmp_path / "chunk-7-dataset.json").write_text(
        '{\n  "0": {\n    "input_tokens": "{5: 0.5, 9: 0.5,}",\n    "output_tokens": "{3: 1.0}"\n  },\n'
        '  "21600": {\n    "input_tokens": "{5: 0.5}",\n    "output_tokens": "{3: -1.0}"\n  }\n}\n'
    )
    r = load_servegen(tmp_path, 0, 600, 0.0, np.random.default_rng(0))
    assert len(r) > 100 and set(r.input_len) == {5, 9}
    ds = ws._Dataset(tmp_path / "chunk-7-dataset.json")
    assert [x.tolist() for x in ds[0]["input_tokens"]] == [[5, 9], [0.5, 0.5]]
    with pytest.raises(TraceError, match=r"chunk-7-dataset\.json:8: window 21600 output_tokens: probability -1\.0"):
        load_servegen(tmp_path, 21600, 600, 0.0, np.random.default_rng(0))


def test_power_fit_cli_reads_the_data_folder_and_says_when_it_is_empty(tmp_path, monkeypatch, capsys):
    """``python -m systems.energy_serving.power_fit`` reads the data folder's gpu_power/ (it read
    ``../shared/data`` beside the repository's parent, and --help died with FileNotFoundError there);
    without the files: exit 2 naming the folder and the fetch command. Mutation caught: the default
    folder back to a path of its own."""
    from systems.energy_serving import power_fit

    with pytest.raises(SystemExit) as e:
        power_fit.main(["--help"])
    assert e.value.code == 0 and "--data" in capsys.readouterr().out
    monkeypatch.setenv("TTC_DATA_DIR", str(tmp_path))
    assert power_fit.main([]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}/gpu_power/perseus_a100_sxm: none of the Perseus profiles" in err and "workloads.fetch" in err
    from tests.conftest import FIXTURE_DATA

    monkeypatch.setenv("TTC_DATA_DIR", str(FIXTURE_DATA))
    assert power_fit.main([]) == 0
    assert "'n_rows': 608" in capsys.readouterr().out
