"""E2 data: loading, column mapping, validation errors, the synthetic market, splits."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from jaxdqn.config import DataConfig, SyntheticConfig
from jaxdqn.market import data, splits
from jaxdqn.market import synthetic as synthetic_lib
from jaxdqn.market.data import COLUMNS, DataError

# Ten hand-written consistent daily bars (Mon 2020-01-06 .. Fri 2020-01-17).
GOOD = """date,open,high,low,close,volume
2020-01-06,10.0,11.0,9.5,10.5,1000
2020-01-07,10.5,10.8,10.1,10.2,1100
2020-01-08,10.2,10.6,9.9,10.4,900
2020-01-09,10.4,10.9,10.3,10.8,0
2020-01-10,10.8,11.2,10.7,11.0,1200
2020-01-13,11.0,11.1,10.5,10.6,1000
2020-01-14,10.6,10.7,10.2,10.3,950
2020-01-15,10.3,10.5,10.0,10.1,1010
2020-01-16,10.1,10.4,9.8,10.35,990
2020-01-17,10.35,10.6,10.3,10.5,1005
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _replace_line(text: str, prefix: str, new: str) -> str:
    lines = text.splitlines()
    (i,) = [k for k, line in enumerate(lines) if line.startswith(prefix)]
    lines[i] = new
    return "\n".join(lines) + "\n"


def _good_frame() -> pd.DataFrame:
    import io

    return pd.read_csv(io.StringIO(GOOD))


def _raises(source, *fragments, column_map=None, fmt=None) -> str:
    with pytest.raises(DataError) as info:
        data.load_ohlcv(source, column_map, fmt=fmt)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for frag in fragments:
        assert frag in msg, (frag, msg)
    return msg


# ---------------------------------------------------------------------------------------------
# The bundled S&P 500
# ---------------------------------------------------------------------------------------------


def test_e2_sp500_bundled():
    df = data.load_ohlcv("sp500")
    assert len(df) == 5031
    assert list(df.columns) == list(COLUMNS)
    assert all(df[c].dtype == np.float64 for c in COLUMNS)
    assert isinstance(df.index, pd.DatetimeIndex) and df.index.name == "date"
    assert df.index.tz is None
    assert df.index[0] == pd.Timestamp("1999-01-04")
    assert df.index[-1] == pd.Timestamp("2018-12-31")
    assert df.index.is_monotonic_increasing and df.index.is_unique
    # First and last rows of the shipped file, read by eye.
    np.testing.assert_allclose(
        df.iloc[0].to_numpy(), [1229.229980, 1248.810059, 1219.099976, 1228.099976, 877000000]
    )
    np.testing.assert_allclose(
        df.iloc[-1].to_numpy(), [2498.939941, 2509.239990, 2482.820068, 2506.850098, 3442870000]
    )
    assert "sp500" in df.attrs["source"]


def test_e2_load_dispatch(tmp_path):
    sp = data.load(DataConfig())
    assert len(sp) == 5031
    p = _write(tmp_path, "bars.csv", GOOD.replace("close", "Px"))
    df = data.load(DataConfig(source="csv", path=str(p), columns={"Px": "close"}))
    assert df["close"].iloc[0] == 10.5
    q = tmp_path / "bars.parquet"
    df.to_parquet(q)
    pd.testing.assert_frame_equal(
        data.load(DataConfig(source="parquet", path=str(q))), df, check_freq=False
    )
    # source=csv forces the CSV reader whatever the suffix.
    r = _write(tmp_path, "bars.dat", GOOD)
    assert len(data.load(DataConfig(source="csv", path=str(r)))) == 10
    syn = data.load(DataConfig(source="synthetic", synthetic=SyntheticConfig(num_bars=300)))
    assert len(syn) == 300 and "oracle" in syn.columns


# ---------------------------------------------------------------------------------------------
# Files, columns, defaults
# ---------------------------------------------------------------------------------------------


def test_e2_csv_values_and_volume_zero(tmp_path):
    df = data.load_ohlcv(_write(tmp_path, "bars.csv", GOOD))
    assert df.shape == (10, 5)
    assert df.index[3] == pd.Timestamp("2020-01-09")
    assert df.loc["2020-01-09", "volume"] == 0.0  # zero volume is allowed
    assert df.loc["2020-01-16", "close"] == 10.35
    assert df.attrs["source"].endswith("bars.csv")


def test_e2_csv_gz_and_semicolons(tmp_path):
    p = tmp_path / "bars.csv.gz"
    with gzip.open(p, "wt") as fh:
        fh.write(GOOD)
    assert len(data.load_ohlcv(p)) == 10
    q = _write(tmp_path, "semi.csv", GOOD.replace(",", ";"))
    pd.testing.assert_frame_equal(data.load_ohlcv(q), data.load_ohlcv(p), check_freq=False)


@pytest.mark.parametrize("date_name", ["Date", "DATE", " datetime ", "Timestamp", "time"])
def test_e2_default_column_names_any_case(tmp_path, date_name):
    header = f"{date_name},Open,HIGH,low,Close,Volume"
    text = GOOD.replace("date,open,high,low,close,volume", header)
    df = data.load_ohlcv(_write(tmp_path, "bars.csv", text))
    assert list(df.columns) == list(COLUMNS)
    assert df.index[0] == pd.Timestamp("2020-01-06")


def test_e2_adj_close_ignored_when_close_exists(tmp_path):
    frame = _good_frame()
    frame["Adj Close"] = frame["close"] * 0.5  # would break OHLC consistency if used
    frame = frame.rename(columns=str.title)
    p = tmp_path / "yahoo.csv"
    frame.to_csv(p, index=False)
    df = data.load_ohlcv(p)
    np.testing.assert_array_equal(df["close"].to_numpy(), _good_frame()["close"].to_numpy())


def test_e2_adj_close_used_when_no_close(tmp_path):
    frame = _good_frame().rename(columns={"close": "Adj Close"})
    p = tmp_path / "adj.csv"
    frame.to_csv(p, index=False)
    df = data.load_ohlcv(p)
    np.testing.assert_array_equal(df["close"].to_numpy(), _good_frame()["close"].to_numpy())


def test_e2_column_map(tmp_path):
    frame = _good_frame().rename(
        columns={"date": "Day", "open": "o", "high": "h", "low": "l", "close": "Px", "volume": "n"}
    )
    frame["close"] = 999.0  # an unrelated column called close: the explicit map wins
    p = tmp_path / "mapped.csv"
    frame.to_csv(p, index=False)
    cmap = {"Day": "date", "o": "open", "h": "high", "l": "low", "Px": "close", "n": "volume"}
    df = data.load_ohlcv(p, cmap)
    pd.testing.assert_frame_equal(df, data.load_ohlcv(_write(tmp_path, "g.csv", GOOD)))
    # Keys also match case-insensitively when unambiguous.
    df2 = data.load_ohlcv(p, {k.upper(): v for k, v in cmap.items()})
    pd.testing.assert_frame_equal(df2, df)
    # Explicitly preferring Adj Close over Close.
    g = _good_frame()
    g["Adj Close"] = g["close"]
    g["close"] = 1.0e6  # inconsistent, but ignored under the map
    g.to_csv(tmp_path / "pref.csv", index=False)
    df3 = data.load_ohlcv(tmp_path / "pref.csv", {"Adj Close": "close"})
    np.testing.assert_array_equal(df3["close"].to_numpy(), _good_frame()["close"].to_numpy())


def test_e2_parquet_date_index_and_column(tmp_path):
    ref = data.load_ohlcv(_write(tmp_path, "g.csv", GOOD))
    frame = _good_frame()
    frame["date"] = pd.to_datetime(frame["date"])
    frame.to_parquet(tmp_path / "col.parquet")
    frame.set_index("date").to_parquet(tmp_path / "idx.parquet")
    unnamed = frame.set_index("date").rename_axis(None)
    unnamed.to_parquet(tmp_path / "unnamed.parquet")
    for name in ("col.parquet", "idx.parquet", "unnamed.parquet"):
        pd.testing.assert_frame_equal(data.load_ohlcv(tmp_path / name), ref, check_freq=False)


def test_e2_dates_yyyymmdd_and_timezones(tmp_path):
    ref = data.load_ohlcv(_write(tmp_path, "g.csv", GOOD))
    ints = GOOD.replace("2020-01-", "202001")
    df = data.load_ohlcv(_write(tmp_path, "ints.csv", ints))
    pd.testing.assert_frame_equal(df, ref, check_freq=False)
    # tz-aware stamps keep their wall-clock date (a New York close stays on its day).
    tz = "\n".join(
        line if i == 0 else line.replace(",", "T16:00:00-05:00,", 1)
        for i, line in enumerate(GOOD.splitlines())
    )
    df = data.load_ohlcv(_write(tmp_path, "tz.csv", tz))
    assert df.index.tz is None
    assert df.index[0] == pd.Timestamp("2020-01-06 16:00")


# ---------------------------------------------------------------------------------------------
# Every DataError
# ---------------------------------------------------------------------------------------------


def test_e2_error_missing_file(tmp_path):
    _raises(tmp_path / "nope.csv", "nope.csv", "no such file")


def test_e2_error_directory(tmp_path):
    d = tmp_path / "dir.csv"
    d.mkdir()
    _raises(d, "dir.csv", "directory")


def test_e2_error_binary_garbage(tmp_path):
    rng = np.random.default_rng(0)
    blob = bytes(rng.integers(128, 256, size=400, dtype=np.uint8))
    for name in ("junk.csv", "junk.csv.gz", "junk.parquet"):
        (tmp_path / name).write_bytes(blob)
        _raises(tmp_path / name, name, "not a readable")


def test_e2_error_empty_file(tmp_path):
    for name in ("empty.csv", "empty.parquet"):
        (tmp_path / name).write_bytes(b"")
        _raises(tmp_path / name, name, "empty file")


def test_e2_error_parquet_that_is_not(tmp_path):
    p = _write(tmp_path, "text.parquet", GOOD)
    _raises(p, "text.parquet", "not a readable parquet table")


def test_e2_error_unknown_file_type(tmp_path):
    p = _write(tmp_path, "bars.xlsx", GOOD)
    _raises(p, "bars.xlsx", "unknown file type")


def test_e2_error_header_only_and_one_row(tmp_path):
    _raises(_write(tmp_path, "hdr.csv", GOOD.splitlines()[0] + "\n"), "hdr.csv", "0 rows")
    one = "\n".join(GOOD.splitlines()[:2]) + "\n"
    _raises(_write(tmp_path, "one.csv", one), "one.csv", "1 row of", "at least 2")


def test_e2_error_not_a_table(tmp_path):
    _raises(
        _write(tmp_path, "prose.csv", "hello world\nthis is text\n"), "prose.csv", "not an OHLCV"
    )


def test_e2_error_missing_column(tmp_path):
    p = tmp_path / "nolow.csv"
    _good_frame().drop(columns="low").to_csv(p, index=False)
    _raises(p, "nolow.csv", "missing column 'low'", "not all of open, high and low")
    q = tmp_path / "nodate.csv"
    _good_frame().rename(columns={"date": "when"}).to_csv(q, index=False)
    _raises(q, "nodate.csv", "missing column 'date'", "'when'")


def test_e2_error_ambiguous_column(tmp_path):
    frame = _good_frame()
    frame["CLOSE"] = frame["close"]
    frame.to_csv(tmp_path / "amb.csv", index=False)
    _raises(tmp_path / "amb.csv", "amb.csv", "ambiguous", "close")


def test_e2_error_bad_column_map(tmp_path):
    p = _write(tmp_path, "g.csv", GOOD)
    _raises(p, "g.csv", "'Px'", "not found", column_map={"Px": "close"})
    _raises(p, "g.csv", "'price'", "is not one of", column_map={"close": "price"})
    _raises(p, "g.csv", "two columns", column_map={"open": "close", "close": "close"})


BAD_ROWS = [
    # (name, replacement for the 2020-01-08 row, fragments the message must contain)
    ("nan", "2020-01-08,10.2,10.6,9.9,,900", ["column 'close'", "missing or NaN"]),
    ("nan_word", "2020-01-08,10.2,10.6,9.9,nan,900", ["column 'close'", "missing or NaN"]),
    ("inf", "2020-01-08,10.2,inf,9.9,10.4,900", ["column 'high'", "infinite"]),
    ("text", "2020-01-08,10.2,10.6,9.9,ten,900", ["column 'close'", "non-numeric", "ten"]),
    ("zero_price", "2020-01-08,0.0,10.6,0.0,10.4,900", ["column 'open'", "non-positive"]),
    ("negative_price", "2020-01-08,10.2,10.6,-9.9,10.4,900", ["column 'low'", "non-positive"]),
    ("negative_volume", "2020-01-08,10.2,10.6,9.9,10.4,-1", ["column 'volume'", "negative"]),
    ("high_below_close", "2020-01-08,10.2,10.3,9.9,10.4,900", ["column 'high'", "max(open"]),
    ("high_below_open", "2020-01-08,10.7,10.6,9.9,10.4,900", ["column 'high'", "max(open"]),
    ("low_above_open", "2020-01-08,10.2,10.6,10.3,10.4,900", ["column 'low'", "min(open"]),
    ("low_above_close", "2020-01-08,10.5,10.6,10.45,10.4,900", ["column 'low'", "min(open"]),
]


@pytest.mark.parametrize("case", BAD_ROWS, ids=[c[0] for c in BAD_ROWS])
def test_e2_error_bad_values(tmp_path, case):
    name, row, fragments = case
    p = _write(tmp_path, f"{name}.csv", _replace_line(GOOD, "2020-01-08", row))
    _raises(p, f"{name}.csv", "row 2 (2020-01-08)", *fragments)


def test_e2_error_bad_values_parquet(tmp_path):
    frame = _good_frame()
    frame.loc[4, "low"] = np.nan
    frame.to_parquet(tmp_path / "nan.parquet")
    _raises(tmp_path / "nan.parquet", "nan.parquet", "2020-01-10", "column 'low'", "NaN")


def test_e2_error_duplicate_timestamp(tmp_path):
    text = _replace_line(GOOD, "2020-01-09", "2020-01-08,10.4,10.9,10.3,10.8,0")
    _raises(_write(tmp_path, "dup.csv", text), "dup.csv", "row 3 (2020-01-08)", "duplicate")


def test_e2_error_decreasing_timestamps(tmp_path):
    text = _replace_line(GOOD, "2020-01-09", "2020-01-03,10.4,10.9,10.3,10.8,0")
    _raises(
        _write(tmp_path, "back.csv", text),
        "back.csv",
        "row 3 (2020-01-03)",
        "column 'date'",
        "not strictly increasing (previous row is 2020-01-08)",
    )


def test_e2_error_unparseable_date(tmp_path):
    text = _replace_line(GOOD, "2020-01-09", "2020-13-45,10.4,10.9,10.3,10.8,0")
    _raises(
        _write(tmp_path, "d.csv", text),
        "d.csv",
        "row 3: column 'date'",
        "unparseable date '2020-13-45'",
    )
    text = GOOD.replace("2020-01-", "1577")  # numbers that are not YYYYMMDD
    _raises(
        _write(tmp_path, "n.csv", text), "n.csv", "row 0: column 'date'", "date 157706 ", "YYYYMMDD"
    )


def test_e2_only_data_errors_escape_on_corrupted_files(tmp_path):
    """Random byte corruption of a good file: either valid bars or a DataError, nothing else."""
    rng = np.random.default_rng(7)
    good = GOOD.encode()
    outcomes = {"ok": 0, "error": 0}
    for k in range(60):
        raw = bytearray(good)
        for pos in rng.integers(0, len(raw), size=int(rng.integers(1, 6))):
            raw[pos] = int(rng.integers(0, 256))
        p = tmp_path / f"c{k}.csv"
        p.write_bytes(bytes(raw))
        try:
            df = data.load_ohlcv(p)
        except DataError as e:
            assert "\n" not in str(e) and f"c{k}.csv" in str(e)
            outcomes["error"] += 1
        else:
            assert list(df.columns) == list(COLUMNS)
            outcomes["ok"] += 1
    assert outcomes["error"] > 0


# ---------------------------------------------------------------------------------------------
# Synthetic market
# ---------------------------------------------------------------------------------------------


def _sharpe(x: np.ndarray) -> float:
    return float(x.mean() / x.std(ddof=1) * math.sqrt(252))


def test_e2_synthetic_deterministic_and_valid():
    cfg = SyntheticConfig(num_bars=500, seed=3)
    a, b = data.synthetic(cfg), data.synthetic(cfg)
    pd.testing.assert_frame_equal(a, b)
    c = data.synthetic(SyntheticConfig(num_bars=500, seed=4))
    assert not np.allclose(a["close"], c["close"])
    assert list(a.columns) == [*COLUMNS, "oracle"]
    assert all(a[k].dtype == np.float64 for k in a.columns)
    # Same checks as user data: OHLC consistent, positive, increasing dates.
    data.validate_ohlcv(a[list(COLUMNS)], "synthetic")
    assert a.index[0] == pd.Timestamp(cfg.start_date)
    assert (a.index.day_of_week < 5).all()
    assert a["close"].iloc[0] == cfg.start_price
    assert (a["volume"] > 0).all()
    gaps = np.log(a["open"].to_numpy()[1:] / a["close"].to_numpy()[:-1])
    assert 0 < gaps.std() < 0.5 * cfg.vol  # small open gaps


def test_e2_synthetic_oracle_definition():
    cfg = SyntheticConfig(num_bars=400, seed=1, phi=-0.3)
    df = data.synthetic(cfg)
    r = np.diff(np.log(df["close"].to_numpy()))
    oracle = df["oracle"].to_numpy()
    assert oracle[0] == 0.0
    np.testing.assert_array_equal(oracle[1:], np.sign(cfg.phi * r))
    assert set(np.unique(oracle[1:])) <= {-1.0, 1.0}
    # With a drift the oracle follows the conditional mean mu + phi (r - mu).
    cfg2 = SyntheticConfig(num_bars=400, seed=1, phi=0.2, drift=0.002)
    df2 = data.synthetic(cfg2)
    r2 = np.diff(np.log(df2["close"].to_numpy()))
    np.testing.assert_array_equal(df2["oracle"].to_numpy()[1:], np.sign(0.002 + 0.2 * (r2 - 0.002)))


@pytest.mark.parametrize("phi", [0.15, -0.2])
def test_e2_synthetic_planted_signal_is_real(phi):
    cfg = SyntheticConfig(num_bars=4000, seed=11, phi=phi)
    df = data.synthetic(cfg)
    r = np.diff(np.log(df["close"].to_numpy()))  # r[k] = r_{k+1}
    lag1 = np.corrcoef(r[:-1], r[1:])[0, 1]
    assert abs(lag1 - phi) < 0.06
    # The oracle's direction decided after bar t earns r_{t+1}: a clearly positive Sharpe
    # (theory ~ phi sqrt(2/pi) sqrt(252) = 1.9 for phi = 0.15), far above buy-and-hold.
    pnl = df["oracle"].to_numpy()[1:-1] * r[1:]
    assert _sharpe(pnl) > 1.0
    assert _sharpe(pnl) > abs(_sharpe(r[1:])) + 0.5
    # The edge is also there for trades at the next open (the gap is unpredictable).
    o, c = df["open"].to_numpy(), df["close"].to_numpy()
    intraday = np.log(c[2:] / o[2:])
    assert _sharpe(df["oracle"].to_numpy()[1:-1] * intraday) > 1.0


def test_e2_synthetic_closes_gaps_volume_oracle_unchanged_by_the_intrabar_path():
    # Values of the generator before the intrabar path existed (seed 7): the bridge draws from
    # its own stream, so every column but high/low is as it was, whatever the path settings.
    for cfg in (
        SyntheticConfig(num_bars=500, seed=7),
        SyntheticConfig(num_bars=500, seed=7, intrabar_vol=3.0, intrabar_steps=5),
    ):
        df = data.synthetic(cfg)
        pick = [0, 1, 2, 250, 499]
        expected = {
            "open": [99.92867149407803, 99.62413835966515, 100.0578664981304, 63.12834849904868,
                     47.43600976428679],
            "close": [100.0, 100.302621200803, 100.07337791130064, 60.92316180026373,
                      47.08662909743608],
            "volume": [896111.2215932091, 1107985.4875272098, 951607.5149953441,
                       1529549.8176296377, 703756.0283543668],
            "oracle": [0.0, 1.0, -1.0, -1.0, -1.0],
        }  # fmt: skip
        sums = {"open": 34781.28881168924, "close": 34730.42402539756, "oracle": -53.0}
        for col, values in expected.items():
            np.testing.assert_allclose(df[col].to_numpy()[pick], values, rtol=1e-13)
        for col, total in sums.items():
            assert df[col].sum() == pytest.approx(total, rel=1e-12)


@pytest.mark.parametrize("steps, vol", [(2, 1.0), (78, 1.0), (78, 0.0), (400, 4.0)])
def test_e2_synthetic_ohlc_consistent_on_many_bars(steps, vol):
    cfg = SyntheticConfig(num_bars=20_000, seed=5, intrabar_steps=steps, intrabar_vol=vol)
    df = data.synthetic(cfg)
    o, h, lo, c = (df[k].to_numpy() for k in ("open", "high", "low", "close"))
    assert (lo <= np.minimum(o, c)).all() and (np.maximum(o, c) <= h).all()
    assert (lo > 0).all()
    data.validate_ohlcv(df[list(COLUMNS)], "synthetic")
    if vol == 0.0:  # no diffusion: the path is the straight line from open to close
        np.testing.assert_allclose(h, np.maximum(o, c), rtol=1e-14)
        np.testing.assert_allclose(lo, np.minimum(o, c), rtol=1e-14)
    else:  # a bridge leaves the segment [open, close] on almost every bar
        assert (h > np.maximum(o, c)).mean() > 0.5 and (lo < np.minimum(o, c)).mean() > 0.5


def test_e2_synthetic_path_chunking_does_not_change_the_bars(monkeypatch):
    cfg = SyntheticConfig(num_bars=1000, seed=2, intrabar_steps=50)
    whole = data.synthetic(cfg)
    monkeypatch.setattr(
        synthetic_lib, "_BRIDGE_CHUNK", 50 * 7
    )  # 7 bars per chunk, a ragged last one
    pd.testing.assert_frame_equal(data.synthetic(cfg), whole)


def test_e2_synthetic_high_low_from_intrabar_bridge_follow_the_bridge_extremum_law():
    # For a Brownian bridge from a to b with variance s^2 over the bar,
    # P(max - max(a, b) > m) = P(min(a, b) - min < m) = exp(-2 m (m + |b - a|) / s^2);
    # a path of n steps misses the continuous maximum by about 0.5826 s / sqrt(n)
    # (Broadie-Glasserman), so the law is compared at m + that shift.
    cfg = SyntheticConfig(num_bars=20_000, seed=3, intrabar_steps=78, intrabar_vol=1.5)
    df = data.synthetic(cfg)
    o, h, lo, c = (np.log(df[k].to_numpy()) for k in ("open", "high", "low", "close"))
    s = cfg.intrabar_vol * cfg.vol
    shift = 0.5826 * s / math.sqrt(cfg.intrabar_steps)
    span = np.abs(c - o)
    up, down = h - np.maximum(o, c), np.minimum(o, c) - lo
    for m in (0.25 * s, 0.5 * s, 1.0 * s):
        law = np.exp(-2.0 * (m + shift) * (m + shift + span) / s**2).mean()
        assert abs((up > m).mean() - law) < 0.015, m  # binomial sd < 0.004
        assert abs((down > m).mean() - law) < 0.015, m
    # The excursion shrinks as the bar's body grows (independent wicks would not care).
    assert np.corrcoef(down, span)[0, 1] < -0.25
    assert np.corrcoef(up, span)[0, 1] < -0.25


def _old_independent_wick_low(df: pd.DataFrame, sd: float, seed: int = 0) -> np.ndarray:
    """The first generator's low: min(open, close) e^{-|b|}, b ~ N(0, sd^2) independent."""
    o, c = df["open"].to_numpy(), df["close"].to_numpy()
    return np.minimum(o, c) * np.exp(-np.abs(np.random.default_rng(seed).normal(0.0, sd, o.size)))


def test_e2_synthetic_buy_limit_fills_carry_adverse_selection():
    # A buy limit at the previous close P (high urgency, through by b = 5 bps) on bars that open
    # above P and close higher still: with the intrabar bridge the path reaches below P mostly
    # when it ends lower, so fills go with worse closes; with the old independent wicks the
    # fill did not depend on the close at all.
    cfg = SyntheticConfig(num_bars=20_000, seed=8)
    df = data.synthetic(cfg)
    o, c = df["open"].to_numpy()[1:], df["close"].to_numpy()[1:]
    limit = df["close"].to_numpy()[:-1] * (1 - 5e-4)
    sel = (o > limit) & (c > o)
    body = np.log(c / o)[sel]
    new_fill = (df["low"].to_numpy()[1:] < limit)[sel]
    old_fill = (_old_independent_wick_low(df, 0.5 * cfg.vol)[1:] < limit)[sel]
    assert sel.sum() > 4000 and 0.2 < new_fill.mean() < 0.9
    assert np.corrcoef(new_fill, body)[0, 1] < -0.15
    assert np.corrcoef(old_fill, body)[0, 1] > -0.02  # the old generator fails this test
    # Over all bars the filled buys' next-close return is lower than the unfilled ones'.
    ret = np.log(c / limit)
    fill_all = df["low"].to_numpy()[1:] < limit
    assert ret[fill_all].mean() < ret[~fill_all].mean() - cfg.vol


def test_e2_synthetic_start_date_overflow_is_one_clear_error():
    with pytest.raises(DataError, match=r"run past .* earlier data.synthetic.start_date"):
        data.synthetic(SyntheticConfig(num_bars=100_000))


# ---------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------


def _check_contiguous(s: splits.Splits, n: int) -> None:
    assert s.train[0] == 0 and s.test[1] == n
    assert s.train[1] == s.val[0] and s.val[1] == s.test[0]
    for lo, hi in s:
        assert lo < hi


def test_e2_split_sp500_by_date():
    df = data.load_ohlcv("sp500")
    s = splits.split(df, DataConfig(), warmup=56)
    _check_contiguous(s, len(df))
    idx = df.index
    assert idx[s.train[1] - 1] == pd.Timestamp("2012-12-31")
    assert idx[s.val[0]] == pd.Timestamp("2013-01-02")
    assert idx[s.val[1] - 1] == pd.Timestamp("2015-12-31")
    assert idx[s.test[0]] == pd.Timestamp("2016-01-04")
    assert s == splits.Splits((0, 3521), (3521, 4277), (4277, 5031))


def test_e2_split_by_fraction():
    df = data.synthetic(SyntheticConfig(num_bars=1000))
    s = splits.split(df, DataConfig(split="fraction", train_frac=0.7, val_frac=0.15), warmup=50)
    _check_contiguous(s, 1000)
    assert s == splits.Splits((0, 700), (700, 850), (850, 1000))
    s = splits.split(df, DataConfig(split="fraction", train_frac=0.5, val_frac=0.3), warmup=50)
    assert s == splits.Splits((0, 500), (500, 800), (800, 1000))


def test_e2_split_intraday_end_day_belongs_to_train():
    idx = pd.date_range("2012-12-28 10:00", periods=200, freq="6h")
    df = pd.DataFrame(1.0, index=idx.rename("date"), columns=list(COLUMNS))
    cfg = DataConfig(train_end="2012-12-31", val_end="2013-01-10", min_split_rows=2)
    s = splits.split(df, cfg, warmup=0)
    assert idx[s.train[1] - 1] == pd.Timestamp("2012-12-31 22:00")
    assert idx[s.val[0]] == pd.Timestamp("2013-01-01 04:00")


def test_e2_split_errors():
    df = data.synthetic(SyntheticConfig(num_bars=300))
    with pytest.raises(DataError, match=r"300 rows; at least 320 are needed \(warmup 200"):
        splits.split(df, DataConfig(split="fraction", min_split_rows=40), warmup=200)
    # Enough rows overall but val too short at these fractions.
    with pytest.raises(DataError, match=r"split 'val' has 6 bars; at least 20"):
        splits.split(df, DataConfig(split="fraction", train_frac=0.7, val_frac=0.02), warmup=10)
    # The warmup eats the train split.
    with pytest.raises(DataError, match=r"split 'train' has 10 bars after the warmup of 50"):
        splits.split(df, DataConfig(split="fraction", train_frac=0.2, val_frac=0.3), warmup=50)
    # Synthetic dates start 2000-01-03: a date split ending before that leaves train empty.
    with pytest.raises(DataError, match=r"split 'train' is empty: no bars on or before 1999"):
        splits.split(df, DataConfig(train_end="1999-06-30", val_end="2000-06-30"), warmup=10)
    with pytest.raises(DataError, match=r"split 'test' is empty"):
        splits.split(df, DataConfig(train_end="2000-06-30", val_end="2005-01-01"), warmup=10)
    sp = data.load_ohlcv("sp500")
    with pytest.raises(DataError, match=r"sp500.*split 'val' is empty"):
        splits.split(sp, DataConfig(train_end="2012-12-31", val_end="2013-01-01"), warmup=10)


def test_e2_column_map_columns_used_once(tmp_path):
    # 'Close' is mapped to open, so it is not also picked up as the close by name.
    frame = _good_frame().rename(columns={"close": "Close", "open": "first"})
    frame.to_csv(tmp_path / "twice.csv", index=False)
    _raises(
        tmp_path / "twice.csv", "twice.csv", "missing column 'close'", column_map={"Close": "open"}
    )


# ---------------------------------------------------------------------------------------------
# Timestamps as users have them (issue 28)
# ---------------------------------------------------------------------------------------------


def _dated(dates: list[str]) -> str:
    """GOOD's bars with its dates replaced by ``dates`` (10 strings)."""
    lines = GOOD.splitlines()
    return (
        "\n".join([lines[0]] + [d + line[10:] for d, line in zip(dates, lines[1:], strict=True)])
        + "\n"
    )


ISO = [f"2020-01-{d:02d}" for d in (6, 7, 8, 9, 10, 13, 14, 15, 16, 17)]
DAYFIRST = [f"{d:02d}.01.2020 00:00:00.000" for d in (6, 7, 8, 9, 10, 13, 14, 15, 16, 17)]


def test_e2_date_format_reads_the_given_pattern(tmp_path):
    ref = data.load_ohlcv(_write(tmp_path, "iso.csv", _dated(ISO)))
    path = _write(tmp_path, "fx.csv", _dated(DAYFIRST))
    df = data.load_ohlcv(path, date_format="%d.%m.%Y %H:%M:%S.%f")
    assert df.index.equals(ref.index)
    odd = _write(tmp_path, "odd.csv", _dated([d.replace("-", "/") for d in ISO]))
    assert data.load_ohlcv(odd, date_format="%Y/%m/%d").index.equals(ref.index)
    # a row that does not match, and a pattern that is not one: one line each
    msg = _raises_load(
        path, "row 0: column 'date'", "data.date_format is '%Y-%m-%d'", date_format="%Y-%m-%d"
    )
    assert "13.01" not in msg  # the first row that fails is named
    _raises_load(path, "data.date_format '%Q'", "not a usable format", date_format="%Q")


def _raises_load(path, *fragments, **kw) -> str:
    with pytest.raises(DataError) as info:
        data.load_ohlcv(path, **kw)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for frag in fragments:
        assert frag in msg, (frag, msg)
    return msg


def test_e2_dayfirst_is_detected_from_a_field_over_12_and_said_in_a_note(tmp_path):
    ref = data.load_ohlcv(_write(tmp_path, "iso.csv", _dated(ISO)))
    df = data.load_ohlcv(_write(tmp_path, "fx.csv", _dated(DAYFIRST)))
    assert df.index.equals(ref.index)
    (note,) = [n for n in df.attrs["notes"] if "day-first" in n]
    assert "row 5 ('13.01.2020 00:00:00.000')" in note
    # month-first (US) files are detected the same way; so are slashes and 2-digit years
    us = [f"01/{d:02d}/20" for d in (6, 7, 8, 9, 10, 13, 14, 15, 16, 17)]
    df = data.load_ohlcv(_write(tmp_path, "us.csv", _dated(us)))
    assert df.index.equals(ref.index) and any("month-first" in n for n in df.attrs["notes"])
    # said explicitly: no note, the same dates
    df = data.load_ohlcv(_write(tmp_path, "fx2.csv", _dated(DAYFIRST)), dayfirst=True)
    assert df.index.equals(ref.index) and not df.attrs["notes"]
    # ISO dates are never reordered, whatever dayfirst says
    assert data.load_ohlcv(_write(tmp_path, "i.csv", _dated(ISO)), dayfirst=True).index.equals(
        ref.index
    )


def test_e2_ambiguous_and_partly_dayfirst_columns_are_refused(tmp_path):
    # every field <= 12: 03.01.2020 may be 3 January or 1 March; it must not be guessed
    ambiguous = [f"{d:02d}.01.2020" for d in range(1, 11)]
    path = _write(tmp_path, "amb.csv", _dated(ambiguous))
    _raises_load(path, "amb.csv", "may be day-first or month-first", "data.dayfirst")
    df = data.load_ohlcv(path, dayfirst=True)  # ... unless the user says which
    assert df.index[0] == pd.Timestamp("2020-01-01") and df.index[-1] == pd.Timestamp("2020-01-10")
    df = data.load_ohlcv(path, dayfirst=False)
    assert df.index[0] == pd.Timestamp("2020-01-01") and df.index[1] == pd.Timestamp("2020-02-01")
    mixed = [*DAYFIRST[:5], "01.13.2020 00:00:00.000", *DAYFIRST[6:]]
    _raises_load(
        _write(tmp_path, "mixed.csv", _dated(mixed)),
        "different day/month orders",
        "row 5 ('01.13.2020 00:00:00.000')",
        "row 6",
    )
    _raises_load(
        _write(tmp_path, "fx.csv", _dated(DAYFIRST)),
        "row 5 ('13.01.2020 00:00:00.000')",
        "not a month-first date",
        dayfirst=False,
    )


@pytest.mark.parametrize(
    ("date", "row"), [("2262-04-12", 9), ("2300-01-01", 9), ("1677-01-01", 0), ("1600-06-30", 0)]
)
def test_e2_dates_outside_the_nanosecond_range_are_one_line(tmp_path, date, row):
    dates = list(ISO)
    dates[row] = date
    if row == 0:  # keep them increasing: everything else moves into range order
        dates = [date, *ISO[1:]]
    _raises_load(
        _write(tmp_path, "far.csv", _dated(dates)),
        f"row {row}: column 'date'",
        f"date '{date}' is outside the range",
        "1677-09-21 .. 2262-04-11",
    )
    ints = [d.replace("-", "") for d in dates]
    _raises_load(
        _write(tmp_path, "far_int.csv", _dated(ints)),
        f"row {row}: column 'date'",
        "outside the range",
    )


# ---------------------------------------------------------------------------------------------
# Close-only tables and tables without volume (issue 28)
# ---------------------------------------------------------------------------------------------


def test_e2_close_only_table_builds_bars_from_the_closes(tmp_path):
    frame = _good_frame()[["date", "close"]].rename(columns={"close": "Adj Close"})
    path = tmp_path / "closes.csv"
    frame.to_csv(path, index=False)
    df = data.load_ohlcv(path)
    c = frame["Adj Close"].to_numpy()
    prev = np.concatenate([c[:1], c[:-1]])
    np.testing.assert_array_equal(df["close"], c)
    np.testing.assert_array_equal(df["open"], prev)
    np.testing.assert_array_equal(df["high"], np.maximum(prev, c))
    np.testing.assert_array_equal(df["low"], np.minimum(prev, c))
    np.testing.assert_array_equal(df["volume"], 0.0)
    assert df.attrs["close_only"] and not df.attrs["volume"]
    assert any("close-only bars" in n for n in df.attrs["notes"])
    assert any("no volume column" in n for n in df.attrs["notes"])
    _raises_load(path, "close-only table", "data.close_only", close_only=False)
    # close_only=true on a full OHLCV table: the same construction, volume kept
    full = data.load_ohlcv(_write(tmp_path, "g.csv", GOOD), close_only=True)
    np.testing.assert_array_equal(full["open"], prev)
    np.testing.assert_array_equal(full["volume"], _good_frame()["volume"])
    assert full.attrs["close_only"] and full.attrs["volume"]
    # a bad close is named as the close
    bad = frame.copy()
    bad.loc[3, "Adj Close"] = -1.0
    bad.to_csv(path, index=False)
    _raises_load(path, "row 3 (2020-01-09): column 'close': non-positive price -1.0")


def test_e2_one_column_of_a_wide_table_of_closes(tmp_path):
    rng = np.random.default_rng(0)
    wide = pd.DataFrame(
        {f"T{k:02d}": 50 * np.exp(np.cumsum(0.01 * rng.standard_normal(10))) for k in range(20)}
    )
    wide.insert(0, "Date", ISO)
    path = tmp_path / "universe.csv"
    wide.to_csv(path, index=False)
    df = data.load(DataConfig(source="csv", path=str(path), columns={"T07": "close"}))
    # (what the file holds: CSV floats need not round-trip to the last bit on every pandas)
    np.testing.assert_array_equal(df["close"], pd.read_csv(path)["T07"])
    assert df.attrs["close_only"]


def test_e2_table_without_volume_trains_without_the_volume_feature(tmp_path):
    from jaxdqn.config import FeatureConfig
    from jaxdqn.market import features

    p = tmp_path / "novol.csv"
    _good_frame().drop(columns="volume").to_csv(p, index=False)
    df = data.load_ohlcv(p)
    assert not df.attrs["volume"] and not df.attrs["close_only"]
    names = features.feature_names(FeatureConfig(), features.has_volume(df))
    assert "volume_z" not in names and len(names) == len(features.FEATURE_NAMES) - 1
    full = data.load_ohlcv(_write(tmp_path, "g.csv", GOOD))
    assert features.has_volume(full)
