"""`python -m ops dashboard` in a real browser: Debian's chromium, headless, driven through chromium-driver
(selenium), against a dashboard process reading a real Redis that holds a run written in the wire's own
format. The page shows the figures redis-cli reads, follows the run as it goes on, and a sample opens to its
whole text. Also: another host than 127.0.0.1 needs a token, and requests without it are refused."""

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

from streams.codec import encode
from streams.keys import Keys
from streams.schema import Attempt, DeadLetter, Member, Reward

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
THINKING = "<think>2 + 3 makes 5, then times 4</think>\n<answer>(2 + 3) * 4</answer>"
HOSTILE = "<img src=x onerror=\"document.title = 'pwned'\">"  # a model's text is untrusted: shown, never run


async def _write_run(redis, keys: Keys, first: int, count: int) -> None:
    """`count` judged attempts (and their rewards) from index `first`, a trainer state and a version's metrics."""
    for i in range(first, first + count):
        a = Attempt(attempt_id=f"es-v1-m{i}:0:0", work_id=f"es-v1-m{i}", theorem_id=f"cd-{i}", policy_version=1,
                    sample_index=0, proof="<answer>(2 + 3) * 4</answer>",
                    text={0: THINKING, 1: HOSTILE}.get(i, f"try {i}"),
                    task="countdown", member=Member(1000 + i, 1))  # fmt: skip
        entry = await redis.xadd(keys.attempts, encode(a))
        r = Reward(attempt_id=a.attempt_id, theorem_id=a.theorem_id, policy_version=1,
                   verdict="proved" if i == 0 else "rejected", reward=1.0 if i == 0 else 0.1, member=a.member,
                   work_id=a.work_id, detail="ok" if i == 0 else "value 3 != 20",
                   attempt_entry=entry.decode())  # fmt: skip
        await redis.xadd(keys.rewards, encode(r))
    state = {"algo": "es", "version": 1, "members": [], "evals": [], "counts": {"samples": first + count},
             "eval_results": {"0": {"held_out_reward": 0.09, "held_out_exact": 0.0}}}  # fmt: skip
    await redis.hset(keys.trainer_state, "state", orjson.dumps(state))
    metrics = {"version": 1, "reward_mean": 0.2, "pass_rate": 0.1, "staleness": {"0": 4}, "verdicts": {"proved": 1}}
    await redis.xadd(keys.metrics, {b"v": b"1", b"json": orjson.dumps(metrics)})


def _redis_cli(url: str, *argv: str) -> str:
    return subprocess.run(["redis-cli", "-u", url, *argv], capture_output=True, text=True, timeout=10).stdout.strip()


def _dashboard(url: str, *argv: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "ops", "dashboard", "--redis-url", url, "--run", RUN, "--port",
                             "0", "--refresh-s", "0.3", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")})  # fmt: skip
    line = proc.stdout.readline()  # "dashboard of run 'dash' at http://127.0.0.1:PORT/ (Ctrl-C to stop)"
    assert " at http" in line, proc.stderr.read() if proc.poll() is not None else line
    return proc, line.split(" at ", 1)[1].split(" ", 1)[0].split("?", 1)[0]  # the page's address, no token


@needs_browser
@pytest.mark.timeout(120)
async def test_the_page_shows_the_runs_figures_follows_it_and_opens_a_sample(one_redis, one_redis_url):
    keys = Keys(RUN)
    await _write_run(one_redis, keys, 0, 5)
    await one_redis.xadd(keys.dlq, encode(DeadLetter(keys.attempts, "verifiers", "1-0", 5, "poison: unparseable",
                                                     "ver-1", 1, {b"v": b"1"})))  # fmt: skip
    worker = {"slots": 2, "processed": 10, "utilization": 0.5, "sandbox_starts": 2, "updated_ms": 1_000}
    await one_redis.hset(keys.verifier_stats, "vm-1", orjson.dumps(worker))
    proc, url = _dashboard(one_redis_url)
    options = webdriver.ChromeOptions()
    # --no-sandbox: chromium refuses its own sandbox as root, and CI runs as root
    flags = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1800")
    for flag in flags:
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    try:
        driver.get(url)
        wait = WebDriverWait(driver, 30)

        # The page redraws every 0.3 s (innerHTML), so an element found now may be gone when read: read and
        # click through the page's own thread, in one call each.
        def text(element_id: str) -> str | None:
            return driver.execute_script("const e = document.getElementById(arguments[0]); return e && e.innerText",
                                         element_id)  # fmt: skip

        def shown(selector: str) -> bool:
            return driver.execute_script("const e = document.querySelector(arguments[0]); return !!e && "
                                         "getComputedStyle(e).display !== 'none'", selector)  # fmt: skip

        def click(selector: str) -> bool:
            try:
                driver.find_element(By.CSS_SELECTOR, selector).click()  # a real click, where the user clicks
                return True
            except StaleElementReferenceException:
                return False

        wait.until(lambda d: text("stream-rewards-length") is not None)
        assert text("stream-rewards-length") == _redis_cli(one_redis_url, "XLEN", keys.rewards) == "5"
        assert text("stream-attempts-length") == _redis_cli(one_redis_url, "XLEN", keys.attempts)
        assert text("version") == "1" and text("run") == RUN
        assert text("dead-letters-total").startswith(_redis_cli(one_redis_url, "XLEN", keys.dlq) + " in all")
        assert "attempts: poison 1" in text("dead-letters-total")
        lines = driver.execute_script("return document.querySelectorAll('#chart polyline').length")
        assert lines == 4  # the members' reward and exact success, the held-out reward and exact success

        assert text("checks-per-s-vm-1") == "-"  # one report seen: no rate yet
        await one_redis.hset(keys.verifier_stats, "vm-1", orjson.dumps(worker | {"processed": 30, "updated_ms": 3_000}))
        wait.until(lambda d: text("checks-per-s-vm-1") == "10")  # 20 checks in the 2 s between two reports
        await _write_run(one_redis, keys, 5, 3)  # the run goes on: the page follows without a reload
        wait.until(lambda d: text("stream-rewards-length") == "8")
        assert _redis_cli(one_redis_url, "XLEN", keys.rewards) == "8"

        first = '.sample[data-id="es-v1-m0:0:0"]'
        assert not shown(f"{first} .sample-text")
        wait.until(lambda d: click(first))
        wait.until(lambda d: shown(f"{first} .sample-text"))
        opened = driver.execute_script("return document.querySelector(arguments[0]).innerText", f"{first} .sample-text")
        assert "2 + 3 makes 5, then times 4" in opened and "judged:" in opened
        await one_redis.xadd(keys.rewards, {b"v": b"1"})  # undecodable: skipped; the page redraws, still open
        wait.until(lambda d: text("stream-rewards-length") == "9")
        assert shown(f"{first} .sample-text")
        hostile = '.sample[data-id="es-v1-m1:0:0"]'
        wait.until(lambda d: click(hostile))
        wait.until(lambda d: shown(f"{hostile} .sample-text"))
        assert HOSTILE in driver.execute_script("return document.querySelector(arguments[0]).innerText",
                                                f"{hostile} .sample-text")  # fmt: skip
        assert driver.title == "proofstream" and not driver.find_elements(By.CSS_SELECTOR, "#samples img")
        assert driver.execute_script("return document.getElementById('status').className") != "error"
    finally:
        driver.quit()
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_another_host_needs_a_token_and_requests_without_it_are_refused(one_redis_url):
    refused = subprocess.run([sys.executable, "-m", "ops", "dashboard", "--redis-url", one_redis_url, "--host",
                              "0.0.0.0"], cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
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
