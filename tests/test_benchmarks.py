"""Benchmark loaders: record counts, splits, discovery order, hub fallback, corrupt files."""

from __future__ import annotations

import csv
import gzip
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from mlmt_bench import registry
from mlmt_bench.benchmarks import data
from mlmt_bench.benchmarks.gpqa import GPQADiamond, GPQAExtended, GPQAMain
from mlmt_bench.benchmarks.gsm8k import GSM8K, gsm8k_gold
from mlmt_bench.benchmarks.math500 import Math500
from mlmt_bench.benchmarks.mbpp import MBPP, MBPPSanitized
from mlmt_bench.errors import UserError
from mlmt_bench.types import Problem

DATA = Path(data.__file__).resolve().parents[2] / "data"  # shipped with the repository


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start without $MLMT_BENCH_DATA and with the hub reachable (but mocked where used)."""
    monkeypatch.delenv(data.ENV_VAR, raising=False)
    for var in data.OFFLINE_VARS:
        monkeypatch.delenv(var, raising=False)


def _fail_hub(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the hub must not be consulted here")


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", _fail_hub)


# ---------------------------------------------------------------------------------------
# Counts and splits of the real files
# ---------------------------------------------------------------------------------------

#: (train, validation, test) sizes at seed 0 with the default fractions (0.4 / 0.1 / 0.5).
SPLIT_SIZES_SEED0 = {"math500": (195, 46, 259), "gsm8k": (548, 140, 631), "gpqa-diamond": (85, 21, 92)}

ALL = {
    "math500": (Math500, 500),
    "gsm8k": (GSM8K, 1319),
    "mbpp": (MBPP, 974),
    "mbpp-sanitized": (MBPPSanitized, 427),
    "gpqa-diamond": (GPQADiamond, 198),
    "gpqa-main": (GPQAMain, 448),
    "gpqa-extended": (GPQAExtended, 546),
}


@pytest.mark.parametrize("name", sorted(ALL))
def test_registry_counts(name: str, no_hub: None) -> None:
    cls, n = ALL[name]
    assert registry.benchmarks.get(name) is cls
    bench = cls()
    assert bench.name == name
    test = bench.all_problems()
    assert len(test) == n
    assert len({p.id for p in test}) == n
    assert all(isinstance(p, Problem) and p.benchmark == name and p.prompt for p in test)
    assert bench.default_verifier in ("math", "code", "choice")
    assert bench.origin is not None and Path(bench.origin).is_file()
    json.dumps([p.to_json() for p in test])  # JSON-serialisable
    assert [Problem.from_json(p.to_json()) for p in test[:5]] == test[:5]


def test_mbpp_splits(no_hub: None) -> None:
    b = MBPP()
    sizes = {s: len(b.load(s)) for s in ("prompt", "test", "validation", "train")}
    assert sizes == {"prompt": 10, "test": 500, "validation": 90, "train": 374}
    ids = [p.metadata["task_id"] for p in b.load("test")]
    assert ids == list(range(11, 511))
    assert [p.metadata["task_id"] for p in b.load("train")] == list(range(601, 975))


def test_mbpp_sanitized_splits(no_hub: None) -> None:
    b = MBPPSanitized()
    sizes = {s: len(b.load(s)) for s in ("prompt", "test", "validation", "train")}
    assert sizes == {"prompt": 7, "test": 257, "validation": 43, "train": 120}  # = HF "sanitized" splits
    ids = [p.metadata["task_id"] for p in b.all_problems()]
    assert min(ids) == 2 and max(ids) == 809 and ids == sorted(ids)


def test_mbpp_problem_shape(no_hub: None) -> None:
    problems = MBPP().all_problems()
    first = problems[0]
    assert first.id == "mbpp/1" and first.answer is None
    assert first.tests[0] == "assert min_cost([[1, 2, 3], [4, 8, 2], [1, 5, 3]], 2, 2) == 8"
    assert first.prompt.startswith("Write a function to find the minimum cost path")
    assert first.prompt.endswith("Your code should pass these tests:\n" + first.tests[0])
    assert first.metadata["entry_point"] == "min_cost"
    for p in problems:
        assert "\r" not in p.prompt + p.setup + p.metadata["code"] + "".join(p.tests)
        assert p.metadata["entry_point"] and p.metadata["entry_point"] + "(" in p.tests[0].replace(" (", "(")
        assert len(p.tests) >= 3
    assert sum(bool(p.setup) for p in problems) == 2
    assert sum(bool(p.metadata["challenge_tests"]) for p in problems) == 11
    # the reference solution passes its own tests (sanity check of the parsing)
    p = next(p for p in problems if p.metadata["task_id"] == 11)
    ns: dict[str, Any] = {}
    exec(p.metadata["code"] + "\n" + p.setup + "\n" + "\n".join(p.tests), ns)  # noqa: S102
    three = MBPP(shown_tests=3).all_problems()[0]
    assert three.prompt.endswith("\n".join(first.tests[:3]))
    assert MBPP(shown_tests=0).all_problems()[0].prompt == first.metadata["text"]


def test_mbpp_sanitized_problem_shape(no_hub: None) -> None:
    problems = MBPPSanitized().all_problems()
    assert all(p.id.startswith("mbpp-sanitized/") and p.metadata["entry_point"] for p in problems)
    with_imports = [p for p in problems if p.setup]
    assert len(with_imports) == 13 and all(p.setup.startswith("import") for p in with_imports)
    assert all("source_file" in p.metadata for p in problems)


def test_gsm8k_gold(no_hub: None) -> None:
    problems = GSM8K().load("test")
    assert problems[0].id == "gsm8k/0" and problems[0].answer == "18"
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", p.answer) for p in problems)
    assert all("####" not in p.metadata["solution"] for p in problems)
    assert gsm8k_gold("so\n#### 1,234") == "1234"
    assert gsm8k_gold("no marker") is None


def test_math500_problem_shape(no_hub: None) -> None:
    p = Math500().load("test")[0]
    assert p.id == "test/precalculus/807.json"
    assert p.answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert p.metadata["level"] == 2 and p.metadata["subject"] == "Precalculus"


@pytest.mark.parametrize("cls", [Math500, GSM8K, GPQADiamond])
def test_seeded_splits(cls: type, no_hub: None) -> None:
    a, b, c = cls(seed=0), cls(seed=0), cls(seed=1)
    splits = {s: a.load(s) for s in ("train", "validation", "test")}
    ids = {s: {p.id for p in ps} for s, ps in splits.items()}
    assert not ids["train"] & ids["validation"] and not ids["train"] & ids["test"]
    assert not ids["validation"] & ids["test"]
    assert ids["train"] | ids["validation"] | ids["test"] == {p.id for p in a.all_problems()}
    n = len(a.all_problems())
    for split, share in (("test", 0.5), ("validation", 0.1)):  # binomial: within 4 standard deviations
        assert abs(len(ids[split]) - n * share) < 4 * (n * share * (1 - share)) ** 0.5, split
    assert [p.id for p in b.load("test")] == [p.id for p in splits["test"]]  # deterministic
    assert {p.id for p in c.load("test")} != ids["test"]  # seed changes it
    small = cls(seed=0, test_fraction=0.2).load("test")
    assert len(small) < len(splits["test"])
    # file order is kept within a split
    order = {p.id: i for i, p in enumerate(a.all_problems())}
    held = splits["test"]
    assert [order[p.id] for p in held] == sorted(order[p.id] for p in held)


def test_split_sizes_seed0(no_hub: None) -> None:
    """The seed-0 sizes, recorded so a change in the split rule is noticed."""
    got = {n: tuple(len(c(seed=0).load(s)) for s in ("train", "validation", "test"))
           for n, c in [("math500", Math500), ("gsm8k", GSM8K), ("gpqa-diamond", GPQADiamond)]}
    assert got == SPLIT_SIZES_SEED0


def test_gpqa_zip_is_read_in_memory_and_errors_are_one_line(tmp_path: Path, no_hub: None) -> None:
    b = GPQADiamond()
    assert b.origin is None and len(b.all_problems()) == 198
    assert b.origin == str(DATA / "gpqa_dataset.zip")
    bad = tmp_path / "gpqa_dataset.zip"
    raw = (DATA / "gpqa_dataset.zip").read_bytes()
    bad.write_bytes(raw[: len(raw) // 3])
    with pytest.raises(UserError) as info:
        GPQADiamond(path=str(tmp_path)).load("test")
    assert "corrupt or unreadable zip" in str(info.value) and "\n" not in str(info.value)
    assert not list(tmp_path.rglob("*.csv")) and not list(DATA.rglob("*.csv"))  # nothing unpacked to disk


def test_gpqa_split_consistent_across_sets(no_hub: None) -> None:
    d_test = {p.id for p in GPQADiamond(seed=3).load("test")}
    m_test = {p.id for p in GPQAMain(seed=3).load("test")}
    d_all = {p.id for p in GPQADiamond(seed=3).all_problems()}
    assert d_test == m_test & d_all


def test_bad_options() -> None:
    with pytest.raises(UserError, match="unknown option"):
        Math500(bogus=1)
    with pytest.raises(UserError, match="test_fraction"):
        Math500(test_fraction=1.5)
    with pytest.raises(UserError, match="the rest is train"):
        Math500(validation_fraction=0.5, test_fraction=0.5)
    with pytest.raises(UserError, match="unknown split"):
        Math500().load("eval")
    with pytest.raises(UserError, match="shown_tests"):
        MBPP(shown_tests=-1)


# ---------------------------------------------------------------------------------------
# GPQA option shuffling
# ---------------------------------------------------------------------------------------


def _gpqa_rows(which: str) -> list[dict[str, str]]:
    """The member CSV read independently of the loader (zipfile + csv, in memory)."""
    import io
    import zipfile

    from mlmt_bench.benchmarks.gpqa import GPQA_ZIP_PASSWORD

    raw = zipfile.ZipFile(DATA / "gpqa_dataset.zip").read(f"dataset/gpqa_{which}.csv", pwd=GPQA_ZIP_PASSWORD)
    return list(csv.DictReader(io.StringIO(raw.decode("utf-8"), newline="")))


def test_gpqa_options_and_gold(no_hub: None) -> None:
    rows = {r["Record ID"]: r for r in _gpqa_rows("diamond")}
    problems = GPQADiamond(seed=0).all_problems()
    letters = {L: 0 for L in "ABCD"}
    for p in problems:
        row = rows[p.id]
        opts = p.metadata["options"]
        assert len(opts) == 4 and sorted(p.metadata["order"]) == [0, 1, 2, 3]
        assert opts["ABCD".index(p.answer)] == row["Correct Answer"].strip()
        assert sorted(opts) == sorted(
            [row["Correct Answer"].strip()] + [row[f"Incorrect Answer {i}"].strip() for i in (1, 2, 3)]
        )
        assert p.prompt.startswith(row["Question"].strip() + "\n\n(A) ")
        for i, L in enumerate("ABCD"):
            assert f"\n({L}) {opts[i]}" in p.prompt
        letters[p.answer] += 1
    assert all(c > 198 / 4 * 0.5 for c in letters.values()), letters  # not all one letter
    assert sum(p.metadata["duplicate_options"] for p in problems) == 2


def test_gpqa_shuffle_deterministic_and_seeded(no_hub: None) -> None:
    a = GPQAMain(seed=0).all_problems()
    b = GPQAMain(seed=0).all_problems()
    c = GPQAMain(seed=1).all_problems()
    assert [p.metadata["order"] for p in a] == [p.metadata["order"] for p in b]
    assert [p.prompt for p in a] == [p.prompt for p in b]
    changed = sum(x.metadata["order"] != y.metadata["order"] for x, y in zip(a, c))
    assert changed > len(a) // 2
    # the same question is shuffled the same way in every set
    d = {p.id: p.metadata["order"] for p in GPQADiamond(seed=0).all_problems()}
    assert all(d[p.id] == p.metadata["order"] for p in a if p.id in d)
    assert sum(p.metadata["duplicate_options"] for p in a) == 3
    assert sum(p.metadata["duplicate_options"] for p in GPQAExtended().all_problems()) == 4


# ---------------------------------------------------------------------------------------
# Discovery order
# ---------------------------------------------------------------------------------------


def _math_rows(n: int, tag: str) -> list[dict[str, Any]]:
    return [{"problem": f"{tag} {i}?", "answer": str(i), "unique_id": f"{tag}/{i}", "subject": "s", "level": 1,
             "solution": ""} for i in range(n)]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_discovery_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_hub: None) -> None:
    explicit = _write_jsonl(tmp_path / "explicit" / "math500_test.jsonl", _math_rows(3, "explicit"))
    env = _write_jsonl(tmp_path / "env" / "math500_test.jsonl", _math_rows(2, "env"))
    # shipped data only
    assert len(Math500().all_problems()) == 500
    # env var beats shipped
    monkeypatch.setenv(data.ENV_VAR, str(env.parent))
    b = Math500()
    assert len(b.all_problems()) == 2 and b.origin == str(env)
    # explicit path (file or directory) beats env var
    assert len(Math500(path=str(explicit)).all_problems()) == 3
    assert len(Math500(path=str(explicit.parent)).all_problems()) == 3
    # an env dir without this benchmark's file falls through to the shipped data
    assert len(GSM8K().all_problems()) == 1319


def test_shipped_dirs_put_the_repository_data_first() -> None:
    dirs = data.shipped_dirs()
    assert dirs[0] == DATA
    shared = (DATA.parent / ".." / "shared" / "data").resolve()
    assert dirs[-1] == shared  # one more place to look, never needed


def test_shipped_files_match_their_sha256() -> None:
    import hashlib

    lines = (DATA / "SHA256SUMS").read_text().split("\n")
    sums = dict(reversed(line.split()) for line in lines if line.strip())
    assert set(sums) == {"HumanEval.jsonl.gz", "gpqa_dataset.zip", "gsm8k_test.jsonl", "math500_test.jsonl",
                         "mbpp.jsonl", "sanitized-mbpp.json"}
    for name, digest in sums.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name
    assert (DATA / "SOURCES.md").is_file() and (DATA / "LICENSES.md").is_file()
    assert not list(DATA.glob("gpqa_*.csv*"))  # GPQA stays in its password-protected zip


def test_explicit_path_missing(tmp_path: Path, no_hub: None) -> None:
    with pytest.raises(UserError, match=r"math500_test\.jsonl not found in path"):
        Math500(path=str(tmp_path)).load("test")
    with pytest.raises(UserError, match="does not exist"):
        Math500(path=str(tmp_path / "nope.jsonl")).load("test")


def test_missing_everywhere_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_hub: None) -> None:
    monkeypatch.setattr(data, "shipped_dirs", lambda: [tmp_path / "a", tmp_path / "b"])
    monkeypatch.setenv(data.ENV_VAR, str(tmp_path / "envdir"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as info:
        Math500().load("test")
    msg = str(info.value)
    assert "\n" not in msg
    assert "math500_test.jsonl not found" in msg
    assert str(tmp_path / "envdir") in msg and str(tmp_path / "a") in msg and str(tmp_path / "b") in msg
    assert "HuggingFaceH4/MATH-500" in msg and "skipped: HF_HUB_OFFLINE=1" in msg


def test_datasets_offline_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_hub: None) -> None:
    monkeypatch.setattr(data, "shipped_dirs", lambda: [])
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(UserError, match=r"\$MLMT_BENCH_DATA \(not set\).*skipped: HF_DATASETS_OFFLINE=1"):
        GSM8K().load("test")


def test_hub_error_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    def offline(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setattr(data, "shipped_dirs", lambda: [tmp_path])
    with pytest.raises(UserError) as info:
        GSM8K().load("test")
    msg = str(info.value)
    assert "\n" not in msg and "openai/gsm8k (main)" in msg and "ConnectionError: Couldn't reach" in msg
    assert str(tmp_path) in msg and "$MLMT_BENCH_DATA (not set)" in msg


# ---------------------------------------------------------------------------------------
# Hugging Face hub path (datasets.load_dataset mocked with the local rows)
# ---------------------------------------------------------------------------------------


class FakeHub:
    def __init__(self, tables: dict[tuple[str, str | None, str], list[dict[str, Any]]]) -> None:
        self.tables = tables
        self.calls: list[tuple[str, str | None, str]] = []

    def __call__(self, path: str, name: str | None = None, split: str | None = None, **kw: Any) -> Any:
        key = (path, name, split)
        self.calls.append(key)
        if key not in self.tables:
            raise FileNotFoundError(f"no such fake dataset {key}")
        return [dict(r) for r in self.tables[key]]


def _hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tables: Any) -> FakeHub:
    import datasets

    fake = FakeHub(tables)
    monkeypatch.setattr(datasets, "load_dataset", fake)
    monkeypatch.setattr(data, "shipped_dirs", lambda: [tmp_path])
    return fake


def _local(cls: type) -> list[Problem]:
    return cls(path=str(DATA)).load("test")


def test_hub_math500_gsm8k(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    m_rows = [json.loads(x) for x in (DATA / "math500_test.jsonl").read_text().splitlines()]
    g_rows = [json.loads(x) for x in (DATA / "gsm8k_test.jsonl").read_text().splitlines()]
    fake = _hub(monkeypatch, tmp_path, {
        ("HuggingFaceH4/MATH-500", None, "test"): m_rows,
        ("openai/gsm8k", "main", "test"): g_rows,
    })
    b = Math500()
    assert b.load("test") == _local(Math500) and b.origin == "hf://HuggingFaceH4/MATH-500"
    assert GSM8K().load("validation") == GSM8K(path=str(DATA)).load("validation")
    assert fake.calls == [("HuggingFaceH4/MATH-500", None, "test"), ("openai/gsm8k", "main", "test")]


def test_hub_mbpp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from mlmt_bench.benchmarks.mbpp import split_of

    full = [json.loads(x) for x in (DATA / "mbpp.jsonl").read_text().splitlines()]
    san = json.loads((DATA / "sanitized-mbpp.json").read_text())
    tables: dict[Any, list[dict[str, Any]]] = {}
    for cfg, rows in (("full", full), ("sanitized", san)):
        for split in ("train", "test", "validation", "prompt"):
            # the hub lists rows in its own order and adds nothing; shuffle order to check sorting
            part = [r for r in rows if split_of(r["task_id"]) == split][::-1]
            tables[("google-research-datasets/mbpp", cfg, split)] = part
    fake = _hub(monkeypatch, tmp_path, tables)
    assert MBPP().all_problems() == MBPP(path=str(DATA)).all_problems()
    assert MBPPSanitized().all_problems() == MBPPSanitized(path=str(DATA)).all_problems()
    assert {c[1] for c in fake.calls} == {"full", "sanitized"} and len(fake.calls) == 8


def test_hub_gpqa(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tables = {("Idavidrein/gpqa", f"gpqa_{w}", "train"): _gpqa_rows(w) for w in ("diamond", "main", "extended")}
    _hub(monkeypatch, tmp_path, tables)
    for cls in (GPQADiamond, GPQAMain, GPQAExtended):
        b = cls(seed=2)
        assert b.load("test") == cls(path=str(DATA), seed=2).load("test")
        assert b.origin is not None and b.origin.startswith("hf://Idavidrein/gpqa/gpqa_")


def test_hub_rows_missing_field(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _hub(monkeypatch, tmp_path, {("openai/gsm8k", "main", "test"): [{"question": "q"}]})
    with pytest.raises(UserError, match="lacks field"):
        GSM8K().load("test")


# ---------------------------------------------------------------------------------------
# Corrupt and truncated files
# ---------------------------------------------------------------------------------------


def test_jsonl_bad_line(tmp_path: Path) -> None:
    lines = (DATA / "math500_test.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[36] = lines[36][: len(lines[36]) // 2] + "\n"  # line 37 cut in half
    bad = tmp_path / "math500_test.jsonl"
    bad.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(f"{bad}:37: invalid JSON")) as info:
        Math500(path=str(bad)).load("test")
    assert "\n" not in str(info.value)


def test_jsonl_missing_field_and_not_object(tmp_path: Path) -> None:
    bad = _write_jsonl(tmp_path / "m.jsonl", _math_rows(3, "x"))
    text = bad.read_text().splitlines()
    text[1] = json.dumps({"problem": "p", "unique_id": "u"})
    bad.write_text("\n".join(text) + "\n")
    with pytest.raises(UserError, match=re.escape(f"{bad}:2: record lacks field(s) answer")):
        Math500(path=str(bad)).load("test")
    text[1] = "[1, 2]"
    bad.write_text("\n".join(text) + "\n")
    with pytest.raises(UserError, match=re.escape(f"{bad}:2: expected a JSON object")):
        Math500(path=str(bad)).load("test")


def test_gzip_truncated(tmp_path: Path) -> None:
    import io

    rows = _gpqa_rows("diamond")
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    raw = gzip.compress(out.getvalue().encode())
    bad = tmp_path / "gpqa_diamond.csv.gz"
    bad.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(UserError) as info:
        GPQADiamond(path=str(tmp_path)).load("test")
    msg = str(info.value)
    assert re.match(re.escape(str(bad)) + r":\d+: corrupt data file: file is truncated", msg), msg
    assert int(msg.split(":")[1]) > 100  # roughly where the cut is, not line 1
    assert "\n" not in msg


def test_gzip_jsonl_truncated(tmp_path: Path) -> None:
    bad = tmp_path / "gsm8k_test.jsonl.gz"
    bad.write_bytes(gzip.compress((DATA / "gsm8k_test.jsonl").read_bytes())[:5000])
    with pytest.raises(UserError, match=re.escape(str(bad)) + r":\d+: corrupt data file: file is truncated"):
        GSM8K(path=str(bad)).load("test")


def test_gzip_ok(tmp_path: Path) -> None:
    gz = tmp_path / "math500_test.jsonl.gz"
    gz.write_bytes(gzip.compress((DATA / "math500_test.jsonl").read_bytes()))
    assert Math500(path=str(tmp_path)).load("test") == _local(Math500)


_GPQA_HEADER = ["Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3",
                "Record ID", "Subdomain", "High-level domain"]


def _fake_gpqa(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_csv_missing_columns(tmp_path: Path) -> None:
    bad = _fake_gpqa(tmp_path / "gpqa_diamond.csv", _GPQA_HEADER[:5], [["q", "a", "b", "c", "d"]])
    with pytest.raises(UserError, match=re.escape(f"{bad}:1: CSV header lacks column(s) Record ID")):
        GPQADiamond(path=str(bad)).load("test")


def test_csv_truncated_record(tmp_path: Path) -> None:
    rows = [[f"line one\nline two {i}", " right ", "w1", "w2", "w3", f"rec{i}", "s", "Physics"] for i in range(3)]
    good = _fake_gpqa(tmp_path / "gpqa_main.csv", _GPQA_HEADER, rows)
    problems = GPQAMain(path=str(good)).all_problems()
    assert len(problems) == 3 and problems[0].metadata["options"].count("right") == 1
    text = good.read_text(encoding="utf-8")
    cut = text[: text.rindex("rec2") - 6]  # the last record loses its last fields
    good.write_text(cut, encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(f"{good}:6: CSV record has ") + r"\d field\(s\), the header has 8"):
        GPQAMain(path=str(good)).load("test")


def test_json_not_an_array(tmp_path: Path) -> None:
    bad = tmp_path / "sanitized-mbpp.json"
    bad.write_text(json.dumps({"task_id": 2}), encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(f"{bad}:1: expected a JSON array")):
        MBPPSanitized(path=str(tmp_path)).load("test")


def test_json_syntax_error_line(tmp_path: Path) -> None:
    text = (DATA / "sanitized-mbpp.json").read_text(encoding="utf-8")
    bad = tmp_path / "sanitized-mbpp.json"
    bad.write_text(text[: len(text) // 2], encoding="utf-8")  # truncated array
    with pytest.raises(UserError, match=re.escape(str(bad)) + r":\d+: invalid JSON"):
        MBPPSanitized(path=str(bad)).load("test")


def test_json_array_bad_element_line(tmp_path: Path) -> None:
    rows = json.loads((DATA / "sanitized-mbpp.json").read_text(encoding="utf-8"))[:3]
    del rows[2]["test_list"]
    bad = tmp_path / "sanitized-mbpp.json"
    bad.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    starts = [i + 1 for i, ln in enumerate(bad.read_text().split("\n")) if ln == " {"]
    line = starts[2]  # where the third element starts
    with pytest.raises(UserError, match=re.escape(f"{bad}:{line}: record lacks field(s) test_list")):
        MBPPSanitized(path=str(bad)).load("test")


def test_unknown_file_type(tmp_path: Path) -> None:
    p = tmp_path / "data.txt"
    p.write_text("x")
    with pytest.raises(UserError, match="unknown data file type"):
        Math500(path=str(p)).load("test")


def test_copy_of_shipped_file_loads(tmp_path: Path) -> None:
    shutil.copy(DATA / "mbpp.jsonl", tmp_path / "mbpp.jsonl")
    assert len(MBPP(path=str(tmp_path)).all_problems()) == 974


# ---------------------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ALL))
def test_templates_render(name: str, no_hub: None) -> None:
    cls, _ = ALL[name]
    b = cls()
    p = b.load("test")[0]
    t = b.templates
    attempt = t.render_attempt(p)
    assert attempt.startswith(p.prompt)
    assert t.render_feedback(p, "my attempt").count("my attempt") == 1
    assert "FEEDBACK" in t.render_refine("FEEDBACK")
    if b.default_verifier == "math":
        assert "\\boxed{}" in attempt
    elif b.default_verifier == "code":
        assert "```python" in attempt
    else:
        assert "Answer: X" in attempt
