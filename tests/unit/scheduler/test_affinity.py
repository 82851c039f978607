"""Cache-aware routing as plain state (scheduler/affinity.py): block hashes, worker summaries,
the routing decision and the reservations of routed jobs."""

from __future__ import annotations

from scheduler.affinity import (
    BLOCK_CHARS,
    PrefixIndex,
    PrefixRouter,
    PrefixSummary,
    WorkerView,
    block_hashes,
    job_hashes,
    lora_key,
    prompt_text,
    shared_blocks,
)
from scheduler.contract.jobs import CompletionJob, InfillParts, LoraScale

SYSTEM_A = "You are a careful assistant for the harbour office. " * 40  # ~2000 characters
SYSTEM_B = "You answer questions about train timetables, briefly. " * 40


def view(worker_id: str, prompts: list[str], n_free: int = 1) -> WorkerView:
    summary = PrefixSummary.of([block_hashes(p) for p in prompts], n_free)
    return WorkerView(worker_id, summary.n_free, summary.digests(), summary.block_chars)


def test_hashes_are_chained_over_whole_blocks() -> None:
    text = "x" * (3 * BLOCK_CHARS + 10)
    hashes = block_hashes(text)
    assert len(hashes) == 3  # the partial last block is not hashed
    assert len(set(hashes)) == 3  # equal blocks, different hashes: each covers what precedes
    other = block_hashes("y" + text[1:])
    assert not set(hashes) & set(other)  # one changed character changes every later hash
    assert block_hashes(text[: 2 * BLOCK_CHARS]) == hashes[:2]


def test_a_shared_beginning_matches_up_to_the_first_different_block() -> None:
    question_1 = SYSTEM_A + "\nUser: when does the ferry leave?"
    question_2 = SYSTEM_A + "\nUser: how much is a ticket to the island?"
    held = frozenset(block_hashes(question_1))
    n = shared_blocks(block_hashes(question_2), held)
    assert n == len(SYSTEM_A) // BLOCK_CHARS
    assert shared_blocks(block_hashes(SYSTEM_B), held) == 0


def test_token_id_prompts_hash_their_ids() -> None:
    assert prompt_text([1, "a", 22]) == "\x001\x00a\x0022\x00"
    assert prompt_text("plain") == "plain"
    assert block_hashes(prompt_text([7] * 200)) == block_hashes(prompt_text([7] * 300))[:2]
    assert block_hashes(prompt_text([7] * 200))[0] != block_hashes("7" * 300)[0]


def test_lone_surrogates_from_json_do_not_break_hashing() -> None:
    assert len(block_hashes("\ud800" * BLOCK_CHARS)) == 1


def test_infill_jobs_are_not_hashed() -> None:
    job = CompletionJob(model="m", prompt=SYSTEM_A,
                        infill=InfillParts(input_prefix=SYSTEM_A, input_suffix=""))
    assert job_hashes(job) == []
    assert job_hashes(CompletionJob(model="m", prompt=SYSTEM_A)) == block_hashes(SYSTEM_A)


def test_the_worker_holding_the_longest_beginning_wins() -> None:
    router = PrefixRouter(min_chars=1024)
    prompt = block_hashes(SYSTEM_A + "\nUser: when does the ferry leave?")
    views = [view("b", [SYSTEM_B]), view("a", [SYSTEM_A + "\nUser: a ticket?"]),
             view("short", [SYSTEM_A[:1100]])]
    assert router.choose(prompt, views) == "a"


def test_a_prompt_no_worker_holds_goes_to_the_worker_holding_the_least() -> None:
    router = PrefixRouter(min_chars=1024)
    views = [view("a", [SYSTEM_B, SYSTEM_A[:900]], n_free=3), view("b", [SYSTEM_B], n_free=1)]
    assert router.choose(block_hashes(SYSTEM_A), views) == "b"  # a holds more (and too little)
    equal = [view("a", [SYSTEM_B], n_free=1), view("b", [SYSTEM_B], n_free=3)]
    assert PrefixRouter(min_chars=1024).choose(block_hashes(SYSTEM_A), equal) == "b"
    full = [view("a", [SYSTEM_B], n_free=0), view("b", [], n_free=0)]
    assert PrefixRouter(min_chars=1024).choose(block_hashes(SYSTEM_A), full) is None


def test_short_prompts_take_the_shared_queue() -> None:
    router = PrefixRouter(min_chars=1024)
    assert router.choose(block_hashes(SYSTEM_A[:700]), [view("a", [SYSTEM_A])]) is None
    assert router.choose(block_hashes(SYSTEM_A[:700]), [view("a", [])]) is None


def test_followers_of_a_new_prompt_go_where_it_went_before_the_worker_reports_it() -> None:
    clock = [0.0]
    router = PrefixRouter(min_chars=1024, now=lambda: clock[0])
    empty = [view("a", [], n_free=2), view("b", [], n_free=3)]
    first = block_hashes(SYSTEM_A + "\nUser: when does the ferry leave?")
    second = block_hashes(SYSTEM_A + "\nUser: how much is a ticket?")
    assert router.choose(first, empty) == "b"
    router.routed("b")
    router.routed("b")  # b now has fewer free slots than a, yet holds the beginning
    assert router.choose(second, empty) == "b"
    assert router.choose(block_hashes(SYSTEM_B), empty) == "a"  # b got blocks lately: a takes it
    clock[0] += 11  # past RECENT_S: by then b's summary would show it, or b dropped it
    assert router.choose(second, [view("a", [], n_free=2), view("b", [], n_free=1)]) == "a"
    assert len(router.recent) == len(second)  # the old entries were dropped
    assert router.recent_blocks == {"a": len(second)}


def test_busy_holders_send_the_prompt_to_the_shared_queue_not_to_a_cold_worker() -> None:
    router = PrefixRouter(min_chars=1024)
    views = [view("a", [SYSTEM_A], n_free=0), view("b", [], n_free=4)]
    assert router.choose(block_hashes(SYSTEM_A), views) is None


def test_a_worker_without_a_free_slot_is_passed_over() -> None:
    router = PrefixRouter(min_chars=1024)
    prompt = block_hashes(SYSTEM_A)
    assert router.choose(prompt, [view("a", [SYSTEM_A], n_free=0)]) is None
    assert router.choose(prompt, [view("a", [SYSTEM_A], n_free=0),
                                  view("b", [SYSTEM_A[:1500]], n_free=2)]) == "b"


def test_jobs_routed_but_not_started_take_the_free_slots() -> None:
    router = PrefixRouter(min_chars=1024)
    prompt = block_hashes(SYSTEM_A)
    views = [view("a", [SYSTEM_A], n_free=2)]
    assert router.choose(prompt, views) == "a"
    router.routed("a")
    assert router.choose(prompt, views) == "a"
    router.routed("a")
    assert router.choose(prompt, views) is None  # both free slots are spoken for
    router.settled("a")
    assert router.choose(prompt, views) == "a"
    router.settled("a")
    assert not router.pending


def test_equal_matches_prefer_more_free_slots_then_the_first_listed() -> None:
    router = PrefixRouter(min_chars=1024)
    prompt = block_hashes(SYSTEM_A)
    assert router.choose(prompt, [view("a", [SYSTEM_A], 1), view("b", [SYSTEM_A], 3)]) == "b"
    assert router.choose(prompt, [view("a", [SYSTEM_A], 2), view("b", [SYSTEM_A], 2)]) == "a"


def test_off_routes_nothing_and_other_block_sizes_are_ignored() -> None:
    prompt = block_hashes(SYSTEM_A)
    assert PrefixRouter(min_chars=0).choose(prompt, [view("a", [SYSTEM_A])]) is None
    summary = PrefixSummary.of([block_hashes(SYSTEM_A, 128)], 1, block_chars=128)
    other = WorkerView("a", 1, summary.digests(), 128)
    assert PrefixRouter(min_chars=1024).choose(prompt, [other]) is None


def test_summary_round_trips_through_json() -> None:
    summary = PrefixSummary.of([block_hashes(SYSTEM_A), block_hashes(SYSTEM_A + "!")], 3)
    again = PrefixSummary.model_validate_json(summary.model_dump_json())
    assert again.n_free == 3
    assert again.digests() == frozenset(block_hashes(SYSTEM_A))  # duplicates kept once
    assert PrefixSummary.of([], -2).n_free == 0


def test_the_worker_index_follows_its_slots() -> None:
    index = PrefixIndex()
    first = CompletionJob(model="m", prompt=SYSTEM_A)
    second = CompletionJob(model="m", prompt=SYSTEM_B)
    summary = index.summary([first, None], n_free=1)
    assert summary.digests() == frozenset(block_hashes(SYSTEM_A))
    summary = index.summary([second, None], n_free=1)  # slot 0 now holds another prompt
    assert summary.digests() == frozenset(block_hashes(SYSTEM_B))
    assert index.summary([None, None], n_free=2).digests() == frozenset()


def test_a_prompt_hashed_under_one_lora_set_does_not_match_another() -> None:
    """The worker's cache is keyed by LoRA set, so the hashes are too: a prompt cached under
    adapter A draws no request under B; no `lora` hashes as before."""
    plain = CompletionJob(model="m", prompt=SYSTEM_A)
    under_a = plain.model_copy(update={"lora": [LoraScale(id=0, scale=1.0)]})
    under_b = plain.model_copy(update={"lora": [LoraScale(id=1, scale=1.0)]})
    assert job_hashes(plain) == block_hashes(SYSTEM_A)
    assert len({job_hashes(j)[0] for j in (plain, under_a, under_b)}) == 3
    assert lora_key(under_a) == "0:1.0" and lora_key(plain) == ""


def test_a_lora_request_prefers_a_worker_already_running_its_set() -> None:
    """No worker holds the prompt: the free worker whose step groups already run the
    request's set wins over the emptier one; a short prompt goes there as well, and to the
    shared queue when no worker runs its set."""
    router = PrefixRouter()
    lora = "0:1.0"
    hashes = block_hashes(SYSTEM_A)
    empty = view("empty", [], n_free=2)
    busy = WorkerView("busy", 1, frozenset(block_hashes(SYSTEM_B)), lora_sets=frozenset([lora]))
    assert router.choose(hashes, [empty, busy], lora) == "busy"
    assert PrefixRouter().choose(hashes, [empty, busy]) == "empty"
    short = block_hashes("short prompt")
    assert PrefixRouter().choose(short, [empty, busy], lora) == "busy"
    assert PrefixRouter().choose(short, [empty, busy], "1:0.5") is None
    assert PrefixRouter().choose(short, [empty, busy]) is None


def test_a_prompt_hashed_under_one_tenant_group_does_not_match_another() -> None:
    """Under --tenants the hashes start from the job's cache salt: a worker holding tenant A's
    prompt draws no request of tenant B for it (where a request goes tells B nothing of A's
    prompts); the same group matches; no salt hashes as before."""
    plain = CompletionJob(model="m", prompt=SYSTEM_A)
    alice = plain.model_copy(update={"cache_salt": "alice"})
    bob = plain.model_copy(update={"cache_salt": "bob"})
    assert job_hashes(plain) == block_hashes(SYSTEM_A)
    assert len({job_hashes(j)[0] for j in (plain, alice, bob)}) == 3
    assert job_hashes(alice) == job_hashes(alice.model_copy(update={"job_id": "other"}))
    router = PrefixRouter()
    holder = WorkerView("holder", 1, frozenset(job_hashes(alice)))
    cold = view("cold", [], n_free=1)
    assert router.choose(job_hashes(alice), [cold, holder]) == "holder"
    assert router.choose(job_hashes(bob), [holder, cold]) == "cold"
