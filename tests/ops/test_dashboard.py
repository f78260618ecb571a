"""`python -m ops dashboard` in a real browser: Debian's chromium, headless, driven through chromium-driver
(selenium), against a dashboard process reading a real Redis that holds a run written in the wire's own
format. The page shows the figures redis-cli reads, follows the run as it goes on, draws its curves on axes
with values and tooltips in the PNG plots' colours, overlays a second run from the folder of runs, filters the
samples by verdict, version, kind and text, and a sample opens to its problem, its whole text and the
checker's message; a finished run says when it finished instead of a live clock. Also: another host than
127.0.0.1 needs a token, and requests without it are refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest

from streams import samples
from streams.codec import encode
from streams.keys import Keys
from streams.schema import Attempt, DeadLetter, Member, Reward
from streams.theorems import Theorem
from trainer.run_plots import COLORS

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
WHY = None
try:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError as e:
    WHY = f"selenium is not installed ({e})"
if WHY is None and (CHROMIUM is None or DRIVER is None):
    WHY = (
        "chromium and chromium-driver are not installed (.ci/run installs them: apt-get install chromium "
        "chromium-driver)"
    )
if WHY:
    print(f"dashboard browser test skipped: {WHY}")
needs_browser = pytest.mark.skipif(WHY is not None, reason=f"dashboard browser test skipped: {WHY}")

RUN = "dash"
STARTED = 1_700_000_000.0
THINKING = "<think>2 + 3 makes 5, then times 4</think>\n<answer>(2 + 3) * 4</answer>"
HOSTILE = "<img src=x onerror=\"document.title = 'pwned'\">"  # a model's text is untrusted: shown, never run
# Countdown's credit by part (tasks/countdown_check.py PARTS): held-out at v0 and v1, training at v1
PARTS_V0 = {"format": 0.5, "expression": 0.25, "numbers": 0.125, "closeness": 0.05, "solved": 0.0}
PARTS_V1 = {"format": 0.875, "expression": 0.5, "numbers": 0.25, "closeness": 0.2, "solved": 0.125}
TRAIN_PARTS = {"format": 0.75, "expression": 0.5, "numbers": 0.25, "closeness": 0.1, "solved": 0.0625}


async def _write_run(redis, keys: Keys, first: int, count: int) -> None:
    """`count` judged attempts (and their rewards) from index `first`, a trainer state and a version's metrics."""
    for i in range(first, first + count):
        a = Attempt(
            attempt_id=f"es-v1-m{i}:0:0",
            work_id=f"es-v1-m{i}",
            theorem_id=f"cd-{i}",
            policy_version=1,
            sample_index=0,
            proof="<answer>(2 + 3) * 4</answer>",
            text={0: THINKING, 1: HOSTILE}.get(i, f"try {i}"),
            task="countdown",
            member=Member(1000 + i, 1),
        )
        entry = await redis.xadd(keys.attempts, encode(a))
        r = Reward(
            attempt_id=a.attempt_id,
            theorem_id=a.theorem_id,
            policy_version=1,
            verdict="proved" if i == 0 else "rejected",
            reward=1.0 if i == 0 else 0.1,
            member=a.member,
            reason="" if i == 0 else "wrong_answer",
            work_id=a.work_id,
            detail="ok" if i == 0 else "value 3 != 20",
            attempt_entry=entry.decode(),
        )
        await redis.xadd(keys.rewards, encode(r))
        await redis.hset(
            keys.theorems, a.theorem_id, Theorem(a.theorem_id, "countdown", numbers=[2, 3, i + 4], target=20).encode()
        )
    state = {
        "algo": "es",
        "version": 1,
        "members": [],
        "evals": [],
        "counts": {"samples": first + count},
        "eval_results": {
            "0": {"held_out_reward": 0.09, "held_out_exact": 0.0, "problems": 8, "held_out_parts": PARTS_V0},
            "1": {"held_out_reward": 0.25, "held_out_exact": 0.125, "problems": 8, "held_out_parts": PARTS_V1},
        },
    }
    await redis.hset(keys.trainer_state, "state", orjson.dumps(state))
    metrics = {
        "version": 1,
        "attempts": 32,
        "samples": 32,
        "reward_mean": 0.2,
        "pass_rate": 0.1,
        "staleness": {"0": 4},
        "verdicts": {"proved": 1},
        "time": STARTED + 90,
        "rewards_per_s": 2.5,
        "generator_tokens_per_s": 48.0,
        "parts": TRAIN_PARTS,
        "member_spread": {"members": 8, "distinct": 3, "mode": 0.1, "differed": 3, "min": 0.1, "max": 0.35},
    }
    await redis.xadd(keys.metrics, {b"v": b"1", b"json": orjson.dumps(metrics)})
    info = {
        "run": RUN,
        "started": STARTED,
        "settings": {"run": RUN, "algo": "es", "task": "countdown", "iterations": 4},
    }
    await redis.set(keys.run_info, orjson.dumps(info))


def _other_run(folder) -> None:
    """A second run in the folder of runs, as its trainer left it on disk (the overlay reads only files): its
    evaluations with their per-problem figures (v0: 8 at 0.05; v1: p0, p1 solved, 6 at 0.2) and its traces."""
    (folder / "other").mkdir(parents=True)
    settings = {"run": "other", "algo": "grpo", "task": "countdown", "iterations": 2}
    (folder / "other" / "run.json").write_text(json.dumps({"run": "other", "settings": settings, "started": 0.0}))
    records = [
        {"eval": True, "version": 0, "held_out_reward": 0.05, "held_out_exact": 0.0, "problems": 8, "time": 30},
        {"version": 1, "samples": 64, "reward_mean": 0.3, "pass_rate": 0.2, "time": 60},
        {"eval": True, "version": 1, "held_out_reward": 0.4, "held_out_exact": 0.25, "problems": 8, "time": 90},
    ]
    records[0] |= {"problem_rewards": {f"p{i}": 0.05 for i in range(8)}, "problems_solved": []}
    last = {f"p{i}": 1.0 if i < 2 else 0.2 for i in range(8)}
    records[2] |= {"problem_rewards": last, "problems_solved": ["p0", "p1"]}
    (folder / "other" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    said = {0: ["1 + 2 = 3"] * 8, 1: ["(2 + 3) * 4"] * 5 + ["1 + 2 = 3"] * 3}
    for v, answers in said.items():
        found = [
            {"attempt_id": f"eval-v{v}:{i}:0", "eval": True, "policy_version": v, "theorem_id": f"p{i}", "proof": a}
            for i, a in enumerate(answers)
        ]
        samples.append(samples.file_for(folder / "other", v), found)


def _redis_cli(url: str, *argv: str) -> str:
    return subprocess.run(["redis-cli", "-u", url, *argv], capture_output=True, text=True, timeout=10).stdout.strip()


def _browser():
    options = webdriver.ChromeOptions()
    # --no-sandbox: chromium refuses its own sandbox as root, and CI runs as root
    flags = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1800")
    for flag in flags:
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))


def _dashboard(url: str, *argv: str) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "ops", "dashboard", "--redis-url", url, "--run", RUN]
    cmd += ["--port", "0", "--refresh-s", "0.3", *argv]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")},
    )
    line = proc.stdout.readline()  # "dashboard of run 'dash' at http://127.0.0.1:PORT/ (Ctrl-C to stop)"
    assert " at http" in line, proc.stderr.read() if proc.poll() is not None else line
    return proc, line.split(" at ", 1)[1].split(" ", 1)[0].split("?", 1)[0]  # the page's address, no token


class Page:
    """The page in the browser. It redraws every 0.3 s (innerHTML), so an element found now may be gone when
    read: read and click through the page's own thread, in one call each."""

    def __init__(self, driver) -> None:
        self.driver = driver

    def text(self, element_id: str) -> str | None:
        return self.driver.execute_script(
            "const e = document.getElementById(arguments[0]); return e && e.innerText", element_id
        )

    def inner(self, selector: str) -> str | None:
        """The text of the first element `selector` finds (textContent: SVG text has no innerText)."""
        return self.driver.execute_script(
            "const e = document.querySelector(arguments[0]); return e && e.textContent", selector
        )

    def shown(self, selector: str) -> bool:
        return self.driver.execute_script(
            "const e = document.querySelector(arguments[0]); return !!e && getComputedStyle(e).display !== 'none'",
            selector,
        )

    def click(self, selector: str) -> bool:
        try:
            self.driver.find_element(By.CSS_SELECTOR, selector).click()  # a real click, where the user clicks
            return True
        except StaleElementReferenceException:
            return False

    def samples(self) -> list[str]:
        return self.driver.execute_script("return [...document.querySelectorAll('.sample')].map(e => e.dataset.id)")

    def set(self, element_id: str, value: str) -> None:
        """What a user does to a filter or selector: set its value, and the page hears it change."""
        self.driver.execute_script(
            "const e = document.getElementById(arguments[0]); e.value = arguments[1]; "
            "e.dispatchEvent(new Event(e.tagName === 'INPUT' ? 'input' : 'change'))",
            element_id,
            value,
        )

    def lines(self, selector: str = "#chart polyline") -> list[dict]:
        return self.driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(l => ({series: l.dataset.series, run: "
            "l.dataset.run, stroke: l.getAttribute('stroke'), dashed: l.hasAttribute('stroke-dasharray')}))",
            selector,
        )


@needs_browser
@pytest.mark.timeout(180)
async def test_the_page_shows_the_runs_figures_follows_it_and_opens_a_sample(one_redis, one_redis_url, tmp_path):
    keys = Keys(RUN)
    await _write_run(one_redis, keys, 0, 5)
    await one_redis.set(keys.trainer_lease, orjson.dumps({"host": "h", "pid": 1, "token": "t"}))  # a live trainer
    await one_redis.xadd(
        keys.dlq,
        encode(DeadLetter(keys.attempts, "verifiers", "1-0", 5, "poison: unparseable", "ver-1", 1, {b"v": b"1"})),
    )
    worker = {"slots": 2, "processed": 10, "utilization": 0.5, "sandbox_starts": 2, "updated_ms": 1_000}
    await one_redis.hset(keys.verifier_stats, "vm-1", orjson.dumps(worker))
    _other_run(tmp_path / "runs")
    proc, url = _dashboard(one_redis_url, "--dir", str(tmp_path / "runs"))
    driver = _browser()
    page = Page(driver)
    try:
        driver.get(url)
        wait = WebDriverWait(driver, 30)
        wait.until(lambda d: page.text("stream-rewards-length") is not None)
        assert page.text("stream-rewards-length") == _redis_cli(one_redis_url, "XLEN", keys.rewards) == "5"
        assert page.text("stream-attempts-length") == _redis_cli(one_redis_url, "XLEN", keys.attempts)
        assert page.text("version") == "1" and page.text("run") == RUN
        assert page.text("dead-letters-total").startswith(_redis_cli(one_redis_url, "XLEN", keys.dlq) + " in all")
        assert "attempts: poison 1" in page.text("dead-letters-total")
        assert page.text("status").startswith("live · updated")
        assert page.text("refused-wrong_answer") == "4"  # ops verdicts reasons: rewards 1..4 were refused so
        # "did it learn": the result, then the curves in the PNGs' colours, on axes with values, with tooltips
        assert page.text("result-held-out") == (
            "held-out reward 0.090 (v0) → 0.250 (v1); exact 0/8 → 1/8 · 5 training samples"
        )
        assert page.text("result-verdict") == "Did it learn? no per-problem data: noise unknown"  # Redis: means only
        # the credit by part, held-out v0 -> v1 and training at v1, three places as `ops run` says them
        assert page.text("result-parts-held-out") == (
            "held-out by part (v0 -> v1): format 0.500 -> 0.875, expression 0.250 -> 0.500, numbers 0.125 -> 0.250, "
            "closeness 0.050 -> 0.200, solved 0.000 -> 0.125"
        )
        assert page.text("result-parts-training") == (
            "training by part (v1): format 0.750, expression 0.500, numbers 0.250, closeness 0.100, solved 0.062"
        )
        # 5 samples of the paper's 30 x 200 x 500 = 3,000,000: 0.000167% (two significant digits: 0.00017%)
        assert page.text("result-budget") == (
            "training: 5 samples: 0.00017% of the paper's 3M (population 30 x 200 problems x 500 iterations, "
            "Qiu et al. 2025)"
        )
        assert page.text("result-spread") == (
            "last update (v1): 3 of 8 members' rewards differed from the most common (0.100); 3 distinct, 0.100 to "
            "0.350"
        )
        # the chart of the parts: each part's held-out line solid, its training line dashed, in the part's colour
        wait.until(lambda d: len(page.lines("#parts polyline")) == 10)
        assert {(line["series"], line["stroke"], line["dashed"]) for line in page.lines("#parts polyline")} == {
            (f"{kind}_{part}", COLORS[part], kind == "train")
            for part in ("format", "expression", "numbers", "closeness", "solved")
            for kind in ("held_out", "train")
        }
        tips = driver.execute_script(
            "return [...document.querySelectorAll('#parts circle[data-series=held_out_format] title')]"
            ".map(t => t.textContent)"
        )
        assert tips == [
            "format (held-out)\npolicy version 0: 0.500\nversion 0",
            "format (held-out)\npolicy version 1: 0.875\nversion 1",
        ]
        assert page.text("learned-word") == "No per-problem data."  # the chart's question, answered
        wait.until(lambda d: len(page.lines()) == 4)
        drawn = {line["series"]: line["stroke"] for line in page.lines()}
        assert drawn == {k: COLORS[k] for k in ("reward_mean", "pass_rate", "held_out_reward", "held_out_exact")}
        assert drawn["held_out_reward"] == "#2ca02c"  # matplotlib's third colour, as in reward.png
        ticks = driver.execute_script("return [...document.querySelectorAll('#chart .xtick')].map(t => t.textContent)")
        assert ticks == ["0", "1"]  # whole versions
        assert driver.execute_script("return document.querySelectorAll('#chart .ytick').length") >= 3
        assert page.inner("#chart .xlabel") == "policy version"
        tips = driver.execute_script(
            "return [...document.querySelectorAll('#chart circle[data-series=held_out_exact]"
            " title')].map(t => t.textContent)"
        )
        assert tips == [
            "held-out exact success (greedy)\npolicy version 0: 0\nversion 0: 0/8 solved",
            "held-out exact success (greedy)\npolicy version 1: 0.125\nversion 1: 1/8 solved",
        ]
        page.set("x-axis", "samples")
        wait.until(lambda d: page.inner("#chart .xlabel") == "training samples")
        assert [line["stroke"] for line in page.lines("#tokens polyline")] == [COLORS["generator_tokens_per_s"]]

        # the overlay: the other run's four curves, dashed, in the same colours; none again takes them away
        wait.until(lambda d: "other" in page.inner("#overlay-select"))
        page.set("overlay-select", "other")
        wait.until(lambda d: len(page.lines()) == 8)
        overlaid = [line for line in page.lines() if line["run"] == "other"]
        assert {(line["series"], line["stroke"], line["dashed"]) for line in overlaid} == {
            (k, COLORS[k], True) for k in ("reward_mean", "pass_rate", "held_out_reward", "held_out_exact")
        }
        assert "held-out reward (greedy) (other)" in page.text("legend")
        page.set("overlay-select", "")
        wait.until(lambda d: len(page.lines()) == 4)
        # the run selector: the other run's result and curves take the panel's place; this run's come back
        page.set("run-select", "other")
        wait.until(lambda d: (page.text("result-head") or "").startswith("GRPO on countdown"))
        assert {line["run"] for line in page.lines()} == {"other"} and len(page.lines()) == 4
        assert page.text("result-held-out").startswith("held-out reward 0.050 (v0) → 0.400 (v1); exact 0/8 → 2/8")
        # d = 0.95 twice, 0.15 six times: mean 2.8 / 8 = 0.35; deviations 0.6 and -0.2, squares summing to
        # 0.72 + 0.24 = 0.96; sd = sqrt(0.96 / 7) = 0.370328, noise 2 sd / sqrt(8) = 0.261861 < 0.35: learned
        assert page.text("result-verdict") == (
            "Did it learn? learned: held-out reward +0.350 (noise ±0.262), 0 -> 2 of 8 solved (2 gained, 0 lost: "
            "within noise)"
        )
        assert page.text("learned-word") == "Learned."
        assert page.text("result-answers") == (
            'answers: v0: 8 of 8 answers are "1 + 2 = 3"; 1 distinct; v1: 5 of 8 answers are "(2 + 3) * 4", '
            '3 are "1 + 2 = 3"; 2 distinct'
        )
        page.set("run-select", "")
        wait.until(lambda d: {line["run"] for line in page.lines()} == {RUN})

        assert page.text("checks-per-s-vm-1") == "-"  # one report seen: no rate yet
        await one_redis.hset(keys.verifier_stats, "vm-1", orjson.dumps(worker | {"processed": 30, "updated_ms": 3_000}))
        wait.until(lambda d: page.text("checks-per-s-vm-1") == "10")  # 20 checks in the 2 s between two reports
        await _write_run(one_redis, keys, 5, 3)  # the run goes on: the page follows without a reload
        wait.until(lambda d: page.text("stream-rewards-length") == "8")
        assert _redis_cli(one_redis_url, "XLEN", keys.rewards) == "8"

        # the samples' filters: the run's one proved sample is one choice away; text finds what the model wrote
        wait.until(lambda d: len(page.samples()) == 8)
        page.set("f-verdict", "proved")
        wait.until(lambda d: page.samples() == ["es-v1-m0:0:0"])
        page.set("f-verdict", "")
        page.set("f-text", "try [67]")
        wait.until(lambda d: page.samples() == ["es-v1-m7:0:0", "es-v1-m6:0:0"])  # newest first
        page.set("f-text", "")
        page.set("f-kind", "eval")
        wait.until(lambda d: page.samples() == [])
        page.set("f-kind", "all")
        page.set("f-version", "2")
        wait.until(lambda d: page.samples() == [])
        page.set("f-version", "1")
        wait.until(lambda d: len(page.samples()) == 8)

        first = '.sample[data-id="es-v1-m0:0:0"]'
        assert not page.shown(f"{first} .sample-text")
        wait.until(lambda d: page.click(first))
        wait.until(lambda d: page.shown(f"{first} .sample-text"))
        assert page.inner(f"{first} .problem") == "reach 20 from 2, 3, 4, each number once"
        assert "2 + 3 makes 5, then times 4" in page.inner(f"{first} .model-text")
        assert page.inner(f"{first} .judged") == "<answer>(2 + 3) * 4</answer>"
        assert page.inner(f"{first} .checker") == "ok"
        await one_redis.xadd(keys.rewards, {b"v": b"1"})  # undecodable: skipped; the page redraws, still open
        wait.until(lambda d: page.text("stream-rewards-length") == "9")
        assert page.shown(f"{first} .sample-text")
        hostile = '.sample[data-id="es-v1-m1:0:0"]'
        wait.until(lambda d: page.click(hostile))
        wait.until(lambda d: page.shown(f"{hostile} .sample-text"))
        assert page.inner(f"{hostile} .model-text") == HOSTILE
        assert driver.title == "proofstream" and not driver.find_elements(By.CSS_SELECTOR, "#samples img")
        assert driver.execute_script("return document.getElementById('status').className") != "error"
        # a stalled run (trainer/progress.py): the status says so, with the cause, instead of a live clock
        alert = {"cause": "no progress for 61 s: no verifier can start a sandbox (s0: no bwrap)", "version": 1}
        await one_redis.set(keys.trainer_alert, orjson.dumps(alert))
        wait.until(lambda d: (page.text("status") or "").startswith("STALLED at version 1: no progress for 61 s"))
        assert "no bwrap" in page.text("status")
    finally:
        driver.quit()
        proc.terminate()
        assert proc.wait(timeout=30) == 0


@needs_browser
@pytest.mark.timeout(120)
async def test_a_finished_run_says_when_it_finished_instead_of_a_live_clock(one_redis, one_redis_url):
    keys = Keys(RUN)
    await _write_run(one_redis, keys, 0, 2)
    state = orjson.loads(await one_redis.hget(keys.trainer_state, "state"))
    await one_redis.hset(keys.trainer_state, "state", orjson.dumps({**state, "finished": True}))
    info = orjson.loads(await one_redis.get(keys.run_info))
    await one_redis.set(keys.run_info, orjson.dumps({**info, "ended": STARTED + 397}))  # as the trainer records it
    proc, url = _dashboard(one_redis_url)
    driver = _browser()
    page = Page(driver)
    try:
        driver.get(url)
        WebDriverWait(driver, 30).until(lambda d: (page.text("status") or "").startswith("finished"))
        at = driver.execute_script(
            "return new Date(arguments[0] * 1000).toLocaleTimeString([], {hour: '2-digit', "
            "minute: '2-digit', hourCycle: 'h23'})",
            STARTED + 397,
        )
        assert (
            page.text("status")
            == f"finished at {at}, 6 min 37 s · version 1 of 4 · Redis "
            + _redis_cli(one_redis_url, "INFO", "server").split("redis_version:")[1].split()[0]
        )
        assert "live" not in page.text("status") and "updated" not in page.text("status")
    finally:
        driver.quit()
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_another_host_needs_a_token_and_requests_without_it_are_refused(one_redis_url):
    refused = subprocess.run(
        [sys.executable, "-m", "ops", "dashboard", "--redis-url", one_redis_url, "--host", "0.0.0.0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "--token" in refused.stderr
    proc, url = _dashboard(one_redis_url, "--token", "s3cret")
    try:
        with pytest.raises(urllib.error.HTTPError) as no:
            urllib.request.urlopen(url + "api/state", timeout=10)
        assert no.value.code == 401
        with urllib.request.urlopen(url + "api/state?token=s3cret", timeout=10) as ok:
            assert json.loads(ok.read())["run"] == RUN
        asked = urllib.request.Request(url + "api/state", headers={"Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(asked, timeout=10) as ok:
            assert ok.status == 200
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
