"""streams/letters.py: the one writer of a dead letter, and the kinds its reasons are counted by."""

from __future__ import annotations

import time

from streams.letters import letter, reason_kind, too_often


def test_a_letter_keeps_the_entry_byte_for_byte_and_says_who_wrote_it_when():
    fields = {b"v": b"1", b"proof": b"\xff\xfe", b"attempt_id": b"a1"}  # not UTF-8: kept as it was
    before_ms = time.time() * 1000
    dl = letter("{ps:r}:attempts", "verifiers", "c1", b"5-0", fields, 3, "poison: statement missing")
    assert (dl.source, dl.group, dl.consumer) == ("{ps:r}:attempts", "verifiers", "c1")
    assert (dl.original_id, dl.deliveries, dl.reason) == ("5-0", 3, "poison: statement missing")
    assert dl.original == fields and dl.original is not fields
    assert before_ms - 1 <= dl.failed_ms <= time.time() * 1000 + 1


def test_the_delivery_count_reason_is_one_kind_whoever_wrote_it():
    assert too_often(6, 5) == "delivered 6 times (max 5)"
    by_consumer, by_sweep = too_often(6, 5), f"{too_often(5, 5)}, found by the sweep"
    assert reason_kind(by_consumer) == reason_kind(by_sweep) == "delivered too often"
    assert reason_kind("poison: statement missing") == "poison"
    assert reason_kind("infrastructure: verifier: no verdict") == "infrastructure"
