"""Figures per level and workload, and the three ways they are shown: a terminal table, a JSON
file of every request, and an HTML report with plots.

The speech table has the columns the speech servers publish (SGLang-Omni's TTS tracking
issue): offered rate, p95 time to first audible audio, p95 end to end, the share of streams that
underran real-time playback, and the success rate; so our figures compare line by line.

A reply that came back with nothing in it (no token, no audible audio) is *silent*: answered,
but not a success; it has its own column, and a level with one is not held. A level is held
against the idle fleet: each workload's requests sent one at a time before the levels.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots
from rich.console import Console
from rich.table import Table

from bench.omnibench.loadgen import LevelResult, Loop, Plan
from bench.omnibench.workloads import Kind, Sample

# how much worse than on the idle fleet p95 time to first output may get at a level that still
# counts as held ("within my latency target" by default)
HELD_FACTOR = 2.0
_QUANTILES = (50, 95, 99)


def _pct(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {f"p{q}": None for q in _QUANTILES}
    return {f"p{q}": float(np.percentile(values, q)) for q in _QUANTILES}


def summarize(result: LevelResult, kind: str) -> dict[str, Any]:
    """One workload's figures at one level."""
    all_ = [s for s in result.samples if s.kind == kind]
    answered = [s for s in all_ if s.ok]
    ok = [s for s in answered if not s.empty]  # answered with something in it

    def of(name: str) -> list[float]:
        return [v for s in ok if (v := getattr(s, name)) is not None]

    streams = [s for s in ok if s.underruns is not None]
    errors: dict[str, int] = {}
    for s in all_:
        if not s.ok:
            errors[s.error or "?"] = errors.get(s.error or "?", 0) + 1
    return {
        "kind": kind,
        "level": result.level,
        "requests": len(all_),
        "succeeded": len(ok),
        "success_pct": 100.0 * len(ok) / len(all_) if all_ else None,
        "silent": len(answered) - len(ok),
        "throughput_rps": len(ok) / result.wall_s if result.wall_s else None,
        "output_tokens_per_s": sum(of("output_tokens")) / result.wall_s if ok else None,
        "audio_s_per_s": (
            sum(of("audio_s")) / result.wall_s if kind in ("speech", "realtime") else None
        ),
        "first_output_s": _pct([v for s in ok if (v := s.first_output_s) is not None]),
        "e2e_s": _pct([v for s in answered if (v := s.e2e_s) is not None]),  # silent too
        "tpot_s": _pct(of("tpot_s")),
        "itl_s": _pct([gap for s in ok for gap in s.itl_s]),
        "rtf": _pct(of("rtf")),
        "underrun_pct": (
            100.0 * sum(1 for s in streams if s.underruns) / len(streams) if streams else None
        ),
        "errors": errors,
    }


def held_level(idle: dict[str, Any], rows: list[dict[str, Any]]) -> float | None:
    """The highest level (of one workload, rows in order of level) at which every request
    succeeded (none failed, none silent), no stream underran, and p95 time to first output
    stayed within HELD_FACTOR of its value on the idle fleet (``idle``: the workload's row of
    requests sent one at a time)."""
    if not rows or idle["first_output_s"]["p95"] is None:
        return None
    limit = HELD_FACTOR * idle["first_output_s"]["p95"]
    held = None
    for row in rows:
        p95 = row["first_output_s"]["p95"]
        if row["success_pct"] != 100.0 or (row["underrun_pct"] or 0) > 0:
            break
        if p95 is None or p95 > limit:
            break
        held = row["level"]
    return held


@dataclasses.dataclass
class Report:
    plan: Plan
    idle: LevelResult  # each workload alone on the idle fleet: what "held" is judged against
    results: list[LevelResult]
    target_info: dict[str, Any]

    @property
    def kinds(self) -> list[str]:
        return [k.value for k in Kind if k in self.plan.mix]

    def rows(self, kind: str) -> list[dict[str, Any]]:
        return [summarize(r, kind) for r in self.results]

    def held(self, kind: str) -> float | None:
        return held_level(summarize(self.idle, kind), self.rows(kind))

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target_info,
            "loop": self.plan.loop.value,
            "levels": self.plan.levels,
            "mix": {k.value: w for k, w in self.plan.mix.items()},
            "seed": self.plan.seed,
            "duration_s": self.plan.duration_s,
            "requests_per_level": self.plan.requests,
            "held_factor": HELD_FACTOR,
            "idle": {k: summarize(self.idle, k) for k in self.kinds},
            "summary": {k: self.rows(k) for k in self.kinds},
            "held_level": {k: self.held(k) for k in self.kinds},
            "requests": [dataclasses.asdict(s) for r in self.results for s in r.samples],
            "idle_requests": [dataclasses.asdict(s) for s in self.idle.samples],
        }

    # -- terminal -------------------------------------------------------------------------

    def print(self, console: Console) -> None:
        unit = "rate" if self.plan.loop is Loop.OPEN else "users"
        for kind in self.kinds:
            rows = self.rows(kind)
            first = {"chat": "TTFT", "transcription": None}.get(kind, "TTFA")
            table = Table(title=f"{kind} ({self.target_info['model']})", title_justify="left")
            columns = [unit, "req", "ok %", "silent", "req/s"]
            if first:
                columns += [f"{first} p50", f"{first} p95", f"{first} p99"]
            for col in (*columns, "E2E p50", "E2E p95", "E2E p99"):
                table.add_column(col, justify="right")
            if kind == "chat":
                table.add_column("TPOT p50", justify="right")
                table.add_column("ITL p99", justify="right")
                table.add_column("tok/s", justify="right")
            else:
                table.add_column("RTF p50", justify="right")
            if kind in ("speech", "realtime"):
                table.add_column("underrun %", justify="right")
                table.add_column("audio s/s", justify="right")
            for row in [summarize(self.idle, kind), *rows]:
                cells = [
                    f"{row['level']:g}" if row["level"] else "idle", str(row["requests"]),
                    _num(row["success_pct"], 1), str(row["silent"]),
                    _num(row["throughput_rps"], 2),
                    *(_ms(row["first_output_s"][f"p{q}"]) for q in _QUANTILES if first),
                    *(_ms(row["e2e_s"][f"p{q}"]) for q in _QUANTILES),
                ]  # fmt: skip
                if kind == "chat":
                    cells += [
                        _ms(row["tpot_s"]["p50"]), _ms(row["itl_s"]["p99"]),
                        _num(row["output_tokens_per_s"], 1),
                    ]  # fmt: skip
                else:
                    cells.append(_num(row["rtf"]["p50"], 3))
                if kind in ("speech", "realtime"):
                    cells += [_num(row["underrun_pct"], 1), _num(row["audio_s_per_s"], 2)]
                table.add_row(*cells)
            console.print(table)
            held = self.held(kind)
            console.print(
                f"  held up to {unit} {held:g}: p95 {first or 'first output'} within "
                f"{HELD_FACTOR:g}x its value on the idle fleet (one request at a time), every "
                "request answered with something in it, no underrun"
                if held is not None
                else f"  not held even at the lightest level ({unit} {rows[0]['level']:g})"
            )
            for row in rows:
                for error, n in row["errors"].items():
                    console.print(f"  {unit} {row['level']:g}: {n} x {error}")
                if row["silent"]:
                    console.print(
                        f"  {unit} {row['level']:g}: {row['silent']} silent (answered with "
                        "nothing in them: not a success; in end to end, with no first output)"
                    )

    # -- HTML -----------------------------------------------------------------------------

    def html(self) -> str:
        """A self-contained page: plotly.js inlined once, so it opens without a network."""
        figures = [self._distributions(), self._throughput(), self._latency_vs_load()]
        parts = [
            pio.to_html(fig, full_html=False, include_plotlyjs=(i == 0))
            for i, fig in enumerate(figures)
        ]
        info = self.target_info
        title = f"omni-bench: {info['model']} at {info['url']}"
        summary = orjson.dumps(
            {k: v for k, v in self.to_json().items() if k != "requests"},
            option=orjson.OPT_INDENT_2,
        ).decode()
        return (
            f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            "<style>body{font-family:system-ui,sans-serif;margin:2em}"
            "pre{background:#f5f5f5;padding:1em;overflow:auto}</style></head><body>"
            f"<h1>{escape(title)}</h1><p>{self.plan.loop.value} loop, levels "
            f"{', '.join(f'{v:g}' for v in self.plan.levels)}; mix "
            f"{', '.join(f'{k.value} {w:g}' for k, w in self.plan.mix.items())}; seed "
            f"{self.plan.seed}</p>{''.join(parts)}<h2>Figures</h2><pre>{escape(summary)}</pre>"
            "</body></html>"
        )

    def _x_title(self) -> str:
        return "offered load (requests/s)" if self.plan.loop is Loop.OPEN else "concurrent users"

    def _distributions(self) -> go.Figure:
        fig = make_subplots(
            rows=1, cols=2, subplot_titles=("time to first token / audio (s)", "end to end (s)")
        )
        for kind in self.kinds:
            getters: tuple[Callable[[Sample], float | None], ...] = (
                lambda s: s.first_output_s,
                lambda s: s.e2e_s,
            )
            for col, getter in enumerate(getters, 1):
                xs, ys = [], []
                for r in self.results:
                    for s in r.samples:
                        value = getter(s) if s.ok and s.kind == kind else None
                        if value is not None:
                            xs.append(f"{r.level:g}")
                            ys.append(value)
                fig.add_trace(
                    go.Box(x=xs, y=ys, name=kind, legendgroup=kind, showlegend=col == 1),
                    row=1, col=col,
                )  # fmt: skip
        fig.update_layout(boxmode="group", title="Latency distributions per level")
        fig.update_xaxes(title_text=self._x_title())
        return fig

    def _throughput(self) -> go.Figure:
        fig = go.Figure()
        levels = [r.level for r in self.results]
        for kind in self.kinds:
            rows = self.rows(kind)
            fig.add_trace(
                go.Scatter(x=levels, y=[r["throughput_rps"] for r in rows], name=f"{kind} req/s")
            )
            if kind in ("speech", "realtime"):
                fig.add_trace(
                    go.Scatter(
                        x=levels, y=[r["audio_s_per_s"] for r in rows],
                        name=f"{kind} audio s/s", line={"dash": "dot"},
                    )
                )  # fmt: skip
        fig.update_layout(title="Throughput against offered load", xaxis_title=self._x_title())
        return fig

    def _latency_vs_load(self) -> go.Figure:
        fig = go.Figure()
        levels = [r.level for r in self.results]
        for kind in self.kinds:
            rows = self.rows(kind)
            p95 = [r["first_output_s"]["p95"] for r in rows]
            fig.add_trace(go.Scatter(x=levels, y=p95, name=f"{kind} p95 first output"))
            fig.add_trace(
                go.Scatter(
                    x=levels, y=[r["e2e_s"]["p95"] for r in rows], name=f"{kind} p95 end to end",
                    line={"dash": "dot"},
                )
            )  # fmt: skip
            idle = summarize(self.idle, kind)["first_output_s"]["p95"]
            if idle is not None:
                fig.add_hline(
                    y=HELD_FACTOR * idle, line_dash="dash", line_color="grey",
                    annotation_text=f"{kind}: {HELD_FACTOR:g}x idle p95 first output",
                )  # fmt: skip
        fig.update_layout(
            title="p95 latency against offered load", xaxis_title=self._x_title(),
            yaxis_title="seconds",
        )  # fmt: skip
        return fig


def write(report: Report, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out / "results.json", out / "report.html"
    json_path.write_bytes(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2))
    html_path.write_text(report.html())
    return json_path, html_path


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.0f} ms"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"
