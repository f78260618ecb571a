"""The readable view: aligned tables and one-line entries, drawn from the same data `--json` prints."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

from streams import learned
from streams.run_dir import INFO, METRICS, REPORT
from streams.settings import shown_default
from trainer.result import duration, evaluation_line, parts_words, progress

NUMERIC = {"LENGTH", "LAG", "PENDING", "DELIVERIES", "VERSION", "SAMPLES"}
ALGOS = {"es": "ES", "grpo": "GRPO"}
# Figures of `ops run` whose bare name is easily misread.
LABELS = {
    "reward_mean": "members' mean reward (train)",
    "pass_rate": "members' exact (train)",
    "stragglers": "stragglers (orders still out at the update)",
}


NOT_KEPT = (
    "IDLE: not kept in a finished run's data (Redis counts it from when the copy was loaded); AGE, from "
    "the entry id, is the entry's own"
)


def on_copy(run_dir: str) -> str:
    """What a command that changed a finished run's data (`--run-dir`) adds: it was the copy's data."""
    return f"(done on a copy of {run_dir}'s Redis data, gone when this command ends: the run directory is unchanged)"


def emit(args: argparse.Namespace, data: dict[str, Any], render: Callable[[dict], str], changed: bool = False) -> None:
    """Print `data`: one JSON object under `--json`, else its text view. A command that `changed` a finished
    run's data (`--run-dir`: a copy) says so."""
    copy = getattr(args, "run_dir", None) if changed else None
    if copy:
        data = {**data, "copy_of": str(copy)}
    as_json = getattr(args, "json", False)
    shown = orjson.dumps(data).decode() if as_json else render(data)
    print(shown + ("\n" + on_copy(copy) if copy and not as_json else ""), flush=True)


def fail(message: str, code: int) -> int:
    print(f"ops: {message}", file=sys.stderr)
    return code


def since(ms: int | None) -> str:
    """A span Redis reports in milliseconds (an entry's age, a consumer's idle time), in the one duration
    format (trainer/result.py `duration`)."""
    return duration(None if ms is None else ms / 1000)


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell; counts right-aligned so digits line up."""
    widths = [max(len(c) for c in col) for col in zip(headers, *rows, strict=True)]
    out = []
    for row in [headers, *rows]:
        cells = [c.rjust(w) if h in NUMERIC else c.ljust(w) for c, w, h in zip(row, widths, headers, strict=True)]
        out.append("  ".join(cells).rstrip())
    return out


def _undecodable(v: dict) -> str:
    return f"<{v['bytes']} bytes, not UTF-8, base64 {v['base64']}>"


def short(v: Any, width: int = 60, *, quote: bool = True) -> str:
    """One value on one line, cut at `width`: text with spaces quoted (unless `quote` is off: a table cell
    needs no quotes), text with control characters always quoted, escaped."""
    if isinstance(v, dict) and set(v) == {"base64", "bytes"}:
        text = _undecodable(v)
    elif isinstance(v, str):
        bare = v and v.isprintable() and not (quote and any(c in v for c in " \"'="))
        text = v if bare else orjson.dumps(v).decode()
    elif v is None:
        text = "-"
    else:
        text = orjson.dumps(v).decode()
    return text if len(text) <= width else text[: width - 1] + "…"


def long(v: Any, indent: int) -> str:
    """One value in full: text as is, continuation lines indented; other values as `short` would."""
    if isinstance(v, str) and all(c.isprintable() or c in "\n\t" for c in v) and v:
        return v.replace("\n", "\n" + " " * indent)
    return short(v, width=10**9)


def _fields(pairs: dict[str, Any], indent: int = 2) -> list[str]:
    if not pairs:
        return [" " * indent + "(none)"]
    width = max(len(k) for k in pairs) + 2
    return [" " * indent + k.ljust(width) + long(v, indent + width) for k, v in pairs.items()]


# -- commands -----------------------------------------------------------------------------------------


def streams(report: dict[str, Any]) -> str:
    run = report["run"]
    lines = [f"run {run} (keys {{ps:{run}}}:*) on Redis {report['redis_version']}", ""]
    headers = ["STREAM", "LENGTH", "GROUP", "LAG", "PENDING", "LAST DELIVERED", "OLDEST PENDING", "AGE", "IDLE"]
    rows, consumers = [], []
    for name, s in report["streams"].items():
        first = [name, str(s["length"])]
        if not s["groups"]:
            rows.append([*first, "-", "", "", "", "", "", ""])
        for gname, g in s["groups"].items():
            rows.append(
                [
                    *first,
                    gname,
                    str(g["lag"]),
                    str(g["pending"]),
                    g["last_delivered_id"],
                    g["oldest_pending_id"] or "-",
                    since(g["oldest_pending_age_ms"]),
                    since(g["oldest_pending_idle_ms"]),
                ]
            )
            first = ["", ""]
            for c in g["consumers"]:
                consumers.append([c["name"], name, gname, str(c["pending"]), since(c["idle_ms"])])
    lines += table(headers, rows)
    lines.append("")
    if consumers:
        lines += table(["CONSUMER", "STREAM", "GROUP", "PENDING", "IDLE"], consumers)
    else:
        lines.append("no consumers")
    if report.get("idle_kept") is False:
        lines += ["", NOT_KEPT]
    return "\n".join(lines)


def clock(epoch: float | None) -> str:
    return "-" if epoch is None else time.strftime("%H:%M", time.localtime(epoch))


def result(r: dict[str, Any]) -> list[str]:
    """A run's result (trainer/result.py) as the first lines of `ops run`: what ran, how far, the held-out
    evaluation, the samples, the settings that shape it, and how to read the numbers."""
    where = progress(r)
    if r["status"] == "live":
        when = f"live at {where}, {duration(r['wall_s'])} so far"
        if r["eta_s"] is not None:
            when += f", ETA {duration(r['eta_s'])} (about {clock(time.time() + r['eta_s'])})"
    else:
        state = "finished" if r["status"] == "finished" else "interrupted at"
        ended = f" at {clock(r['ended'])}" if r["ended"] else ""
        when = f"{state} {where}{ended} after {duration(r['wall_s'])}"
    lines = [f"run {r['run']}: {when}", f"  {ALGOS.get(r['algo'], r['algo'])} on {r['task']}, {r['model']}"]
    h = r["held_out"]
    if h:
        lines.append(
            f"  {evaluation_line(h)} ({h['last']['problems']} held-out problems, greedy; "
            f"{h['evaluations']} evaluations)"
        )
        lines.append(f"  did it learn? {r['verdict']['words']}")
        if r.get("answers"):
            lines.append(f"  answers: {'; '.join(r['answers'])}")
    else:
        lines.append("  held-out: not evaluated yet")
    lines += [f"  {line}" for line in part_lines(r)]
    trained = (r.get("budget") or {}).get("words") or f"{r['samples']} samples"  # ES: against the paper's
    lines.append(f"  training: {trained}")
    if r.get("spread"):
        lines.append(f"  {r['spread']['words']}")
    rebuilt, shown = r.get("reconstructed_from"), r["settings"]
    if rebuilt:  # a rebuilt record holds the settings its command gave, no others (evals/publish.py)
        shown = {k: v for k, v in shown.items() if v is not None}
    lines.append("  settings: " + ", ".join(f"{k} {shown_default(v)}" for k, v in shown.items()))
    if rebuilt:
        lines.append(f"    (not recorded: {', '.join(k for k in r['settings'] if k not in shown) or 'none'})")
    lines += prompt_lines(r.get("prompt") or {})
    if rebuilt:
        lines.append(f"  files: reconstructed from {rebuilt}, not the trainer's own record")
    if r.get("reading"):
        lines.append(f"  reading: {r['reading']}")
    return lines


def part_lines(r: dict[str, Any]) -> list[str]:
    """Countdown's credit by part (trainer/result.py `by_part`): held-out first -> last, training at the last
    version; [] where the run has none (Lean, runs from before parts were kept)."""
    b = r.get("by_part") or {}
    return [b[k] for k in ("held_out_words", "training_words") if b.get(k)]


def prompt_lines(prompt: dict[str, Any]) -> list[str]:
    """The prompt a run asked with: its format as applied to the task and, where the run recorded it, the chat
    that asked for its first problem, a JSON-quoted line a message."""
    if not prompt.get("format"):
        return []
    asked = f" (for {prompt['theorem_id']})" if prompt.get("theorem_id") else ""
    lines = [f"  prompt: {prompt['format']}{asked}"]
    for m in prompt.get("messages") or []:
        begun = " (begun, the model continues it)" if m["role"] == "assistant" else ""
        lines.append(f"    {m['role']}{begun}: {orjson.dumps(m['content']).decode()}")
    return lines


def run_files(report: dict[str, Any]) -> str:
    """`python -m ops run` of a run kept as its files alone: the result, and why there is no health."""
    return "\n".join(
        [*result(report["result"]), "", "health: not kept (no Redis data in this folder: only the run's files)"]
    )


def run(report: dict[str, Any]) -> str:
    """`python -m ops run`: one screen, the result first."""
    name, t = report["run"], report["trainer"]
    r = report.get("result")
    lines = [*result(r), "", "health:"] if r else [f"run {name}"]
    if alert := report.get("alert"):  # the trainer says the run can make no progress (trainer/progress.py)
        lines.insert(0, f"STALLED at version {alert['version']}: {alert['cause']}")
    if t is None:
        lines.append("trainer: no state in Redis (not started, or another Redis)")
    else:
        c = t["counts"]
        if t["finished"] or (r and r["status"] != "live"):  # nothing waits any more: say what was left over
            lines.append(
                f"trainer: {t['algo']} version {t['version']} ({'finished' if t['finished'] else 'stopped'});"
                f" left at the end: {t['complete_waiting']} orders complete but used by no update, "
                f"{t['in_flight']} in flight, {t['evals_in_flight']} evaluations"
            )
        else:
            lines.append(
                f"trainer: {t['algo']} version {t['version']}; {t['in_flight']} in flight (oldest "
                f"{since(t['oldest_in_flight_ms'])}), {t['complete_waiting']} complete waiting for an "
                f"update, {t['evals_in_flight']} evaluations in flight"
            )
        keys = (
            "samples",
            "members_issued",
            "work_orders",
            "members_used",
            "members_stale_dropped",
            "groups_issued",
            "groups_used",
            "groups_stale_dropped",
            "deadline_updates",
            "late_rewards",
            "duplicate_rewards",
            "resumes",
        )
        lines.append("  " + ", ".join(f"{k} {c[k]}" for k in keys if k in c))
        lost = {k: v for k, v in c.items() if k.startswith(("cut_", "evals_"))}  # orders lost, by outcome
        lines.append("  lost orders: " + (", ".join(f"{k} {v}" for k, v in sorted(lost.items())) or "none"))
    lease = report["lease"]
    lines.append(f"lease: {lease['host']} pid {lease['pid']}" if lease else "lease: none (no trainer running)")
    lines.append("")
    gens = report["generators"]
    if gens:
        lines += table(
            ["GENERATOR", *(k.upper() for k in next(iter(gens.values())))],
            [[n, *(str(v) for v in g.values())] for n, g in gens.items()],
        )
    else:
        lines.append("no generator has reported")
    lines.append("")
    d = report["dead_letters"]
    lines.append(f"dead letters: {d['total']}")
    lines += [f"  {n:>6}  {kind}" for kind, n in sorted(d["by_reason"].items(), key=lambda kv: -kv[1])]
    lines.append("")
    rows = [
        [
            g,
            str(v["pending"]),
            str(v["lag"]),
            v["oldest_pending_id"] or "-",
            since(v["oldest_pending_age_ms"]),
            since(v["oldest_pending_idle_ms"]),
        ]
        for g, v in report["groups"].items()
    ]
    lines += table(["STREAM/GROUP", "PENDING", "LAG", "OLDEST PENDING", "AGE", "IDLE"], rows)
    if report.get("idle_kept") is False:
        lines.append(NOT_KEPT)
    m = report["last_metrics"]
    if m:
        shown = {
            k: m[k]
            for k in (
                "version",
                "reward_mean",
                "pass_rate",
                "members",
                "stragglers",
                "stale_dropped",
                "dead_letters",
                "work_outstanding",
                "attempts_outstanding",
            )
            if k in m
        }
        shown = {LABELS.get(k, k): v for k, v in shown.items()}
        lines += ["", "last version: " + ", ".join(f"{k} {v}" for k, v in shown.items())]
    return "\n".join(lines)


def entry(view: dict[str, Any]) -> str:
    """`<id>  field=value ...` on one line; `!` marks an entry that does not decode, raw fields follow."""
    f = dict(view["fields"])
    if view["type"]:
        f.pop("v", None)  # the schema version is implied once the entry decoded
    original = f.pop("original", None) if view["type"] == "DeadLetter" else None
    if view["type"] is None and isinstance(f.get("json"), str):  # a metrics entry: its figures one by one
        try:
            figures = orjson.loads(f["json"])
        except orjson.JSONDecodeError:
            figures = None
        if isinstance(figures, dict):
            f = {**{k: v for k, v in f.items() if k not in ("json", "v")}, **figures}
    body = " ".join(f"{k}={short(v)}" for k, v in f.items())
    if original is not None:
        body += f" original=<{len(original)} fields>"
    if view["error"]:
        body = f"! {short(view['error'], 100)}  {body}"
    return f"{view['id']}  {body}"


def dlq_list(data: dict[str, Any]) -> str:
    rows = [
        [
            r["id"],
            short(r["source"], 40, quote=False),
            short(r["original_id"], quote=False),
            short(r["deliveries"]),
            since(r["age_ms"]),
            short(r["reason"] or f"! {r['error']}", 80, quote=False),
        ]
        for r in data["dead_letters"]
    ]
    shown = f"{len(rows)} of {data['length']} dead letters in {data['key']}"
    if not rows:
        return shown
    return "\n".join([shown, "", *table(["ID", "SOURCE", "ORIGINAL ID", "DELIVERIES", "AGE", "REASON"], rows)])


def dlq_show(data: dict[str, Any]) -> str:
    lines = [f"dead letter {data['id']} in {data['key']} (age {since(data['age_ms'])})"]
    if data["error"]:
        lines.append(f"  ! does not decode as a DeadLetter: {data['error']}")
    lines += _fields(data["letter"])
    kind = data["original_type"] or "no schema"
    if data["original_error"]:
        kind += f"; does not decode: {data['original_error']}"
    lines += ["", f"original fields ({kind}); requeue puts them back byte for byte:"]
    lines += _fields(data["original"])
    return "\n".join(lines)


def requeued(data: dict[str, Any]) -> str:
    lines = [f"requeued {r['id']} -> {r['source']} {r['new_id']}" for r in data["requeued"]]
    lines += [f"not requeued {r['id']}: {r['error']}" for r in data.get("failed", [])]
    return "\n".join(lines) or "no dead letters"


def purged(data: dict[str, Any]) -> str:
    return f"purged {len(data['purged'])} dead letter{'s' if len(data['purged']) != 1 else ''}"


def _shown(line: str) -> str:
    """A line of untrusted text as is when printable, else escaped: a model's escape sequences never reach
    the terminal."""
    return line if all(c.isprintable() or c == "\t" for c in line) else orjson.dumps(line).decode()


def one_line(text: str, width: int = 160) -> str:
    """Free text (a checker's message, which may quote the model) on one line: as is when it is one printable
    line within `width`, else JSON-quoted, its line breaks and escapes shown, and cut."""
    return text if len(text) <= width and text.isprintable() else short(text, width=width)


def samples(data: dict[str, Any]) -> str:
    """Each sample as a header line (who, what, the verdict), the model's text, the proof it was judged by,
    and the checker's message; the text of each escaped where it is not printable (`_shown`), the checker's
    message on one line (`one_line`)."""
    out = [f"{data['shown']} of {data['matched']} matching samples ({data['source']})"]
    for s in data["samples"]:
        who = s["work_id"] if s["member"] is None else f"{s['work_id']} (seed {s['member'][0]}, sign {s['member'][1]})"
        verdict = s["verdict"] + (f" ({s['reason']})" if s["reason"] else "")
        judged = "cached" if s["cached"] else f"{s['verify_ms']:g} ms in {s['sandbox_id'] or '-'}"
        out += [
            "",
            f"== {s['attempt_id']}  v{s['policy_version']}  {who}  theorem {s['theorem_id']}",
            f"   {verdict}, reward {s['reward']:g}; {judged}",
        ]
        if s.get("parts"):
            out.append(f"   by part: {parts_words(s['parts'])}")
        if "problem" in s:
            first, *rest = problem_lines(s["problem"])
            out += [f"   problem: {_shown(first)}", *(f"     | {_shown(line)}" for line in rest)]
        if s.get("text_missing"):
            out.append("   text: trimmed from the attempts stream (history_s) before it was read")
        else:
            out.append(f"   text ({s['num_tokens']} tokens, {s['gen_ms']:g} ms a sample):")
            out += [f"     | {_shown(line)}" for line in s["text"].split("\n")]
            if s["proof"] != s["text"]:
                out += ["   judged:"] + [f"     | {_shown(line)}" for line in s["proof"].split("\n")]
        if s["detail"]:
            out.append(f"   checker: {one_line(s['detail'])}")
    return "\n".join(out)


def problem_lines(p: dict[str, Any] | None) -> list[str]:
    """A problem in words: Countdown's target and numbers; a Lean statement (with its informal text)."""
    if p is None:
        return ["(not in the run's {ps:R}:theorems)"]
    if p["task"] == "countdown":
        return [f"reach {p['target']} from {', '.join(map(str, p['numbers']))}, each number once"]
    lines = [f"informal: {p['informal']}"] if p.get("informal") else []
    return lines + p["statement"].split("\n")


def theorem(p: dict[str, Any]) -> str:
    """`python -m ops theorem ID`: the problem, then its canonical record's fields."""
    first, *rest = problem_lines(p)
    lines = [f"theorem {p['theorem_id']} ({p['task']}): {_shown(first)}", *(f"  {_shown(line)}" for line in rest)]
    if p.get("header"):
        lines += ["header:", *(f"  {_shown(line)}" for line in p["header"].split("\n"))]
    return "\n".join(lines)


def _held_out_cells(r: dict[str, Any]) -> list[str]:
    h = r["held_out"]
    if not h:
        return ["-", "-"]
    first, last = h["first"], h["last"]
    return [
        f"{first['reward']:.3f} -> {last['reward']:.3f}",
        f"{first['solved']}/{first['problems']} -> {last['solved']}/{last['problems']}",
    ]


def _row(r: dict[str, Any]) -> list[str]:
    wall = duration(r["wall_s"]) + (f" (ETA {duration(r['eta_s'])})" if r.get("eta_s") else "")
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["started"])) if r["started"] else "-"
    return [
        r["name"],
        ALGOS.get(r["algo"], r["algo"] or "-"),
        r["status"],
        progress(r, short=True),
        str(r["samples"]),
        *_held_out_cells(r),
        learned.short(r.get("verdict")) if r["held_out"] else "-",
        wall,
        started,
    ]


RUN_COLUMNS = ["RUN", "ALGO", "STATUS", "VERSION", "SAMPLES", "HELD-OUT REWARD", "EXACT", "LEARNED", "WALL", "STARTED"]


def runs(data: dict[str, Any]) -> str:
    """`python -m ops runs`: a row per run, oldest first."""
    if not data["runs"]:
        return data.get("none") or f"no runs in {data['dir']} (a run directory holds {INFO}, {REPORT} or {METRICS})"
    lines = table(RUN_COLUMNS, [_row(r) for r in data["runs"]])
    count = len(data["runs"])
    return "\n".join([f"{count} run{'' if count == 1 else 's'} in {data['dir']}", "", *lines])


def compare(data: dict[str, Any]) -> str:
    """`python -m ops compare`: the runs' rows, where they differ, the best evaluation, the plot."""
    rs = data["runs"]
    lines = table(RUN_COLUMNS, [_row(r) for r in rs])
    width = max(len(r["name"]) for r in rs)
    lines += ["", "best held-out evaluation:"]
    for r in rs:
        best = r["held_out"]["best"] if r["held_out"] else None
        shown = (
            f"reward {best['reward']:.3f}, exact {best['solved']}/{best['problems']} at v{best['version']}"
            if best
            else "none yet"
        )
        lines.append(f"  {r['name'].ljust(width)}  {shown}")
    lines += ["", "did it learn (first -> last evaluation, problem by problem):"]
    for r in rs:
        lines.append(f"  {r['name'].ljust(width)}  {r['verdict']['words'] if r['held_out'] else 'not evaluated yet'}")
        if r.get("answers"):
            lines.append(f"  {''.ljust(width)}  answers: {'; '.join(r['answers'])}")
    if any(part_lines(r) for r in rs):
        lines += [
            "",
            "credit by part (what the answers have: Countdown's format, expression, numbers, closeness, solved):",
        ]
        for r in rs:
            shown = part_lines(r) or ["none recorded"]
            lines += [f"  {(r['name'] if i == 0 else '').ljust(width)}  {line}" for i, line in enumerate(shown)]
    if any(r.get("budget") for r in rs):
        lines += ["", "ES budget (against the paper's) and the last update's member spread:"]
        for r in (r for r in rs if r.get("budget")):
            shown = [r["budget"]["words"]] + ([r["spread"]["words"]] if r.get("spread") else [])
            lines += [f"  {(r['name'] if i == 0 else '').ljust(width)}  {line}" for i, line in enumerate(shown)]
    if data["differ"]:
        lines += ["", "they differ in:"]
        for key, values in data["differ"].items():
            lines.append(f"  {key}: " + " | ".join(shown_default(v) for v in values))
    readings = list(dict.fromkeys(r["reading"] for r in rs if r.get("reading")))  # the compared runs' own tasks
    lines += ["", *(f"reading: {reading}" for reading in readings)] if readings else []
    lines.append(f"plot: {data['plot']}" if data["plot"] else "plot: none (matplotlib is not installed)")
    lines += data["elsewhere"]
    return "\n".join(lines)
