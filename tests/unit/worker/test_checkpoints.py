"""Context checkpoints (worker/kv/checkpoints.py) and their moves (worker/kv/moves.py) on a
simulated sliding-window cache: llama-server's rules for where a checkpoint is taken, which
ones make room, and when a reused prefix needs one (pos_min against pos_next - n_swa)."""

from __future__ import annotations

from worker.kv.checkpoints import Checkpoint, CheckpointRules
from worker.kv.moves import prepare_slot, restore_prefix, take_checkpoint
from worker.kv.slots import SlotCache

RULES = CheckpointRules(n_max=4, min_step=100, n_swa=8, n_batch=64, n_ubatch=16)


def cp(n_tokens: int, task: int = 1, pos_min: int | None = None) -> Checkpoint:
    return Checkpoint(n_tokens, n_tokens - 8 if pos_min is None else pos_min, n_tokens - 1,
                      b"x" * n_tokens, task)


class SwaKv:
    """One sequence per slot whose cells are the last `window` positions decoded (an SWA
    cache after pruning); a partial state is the cells it holds."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.cells: dict[int, set[int]] = {}

    def decode(self, seq: int, upto: int) -> None:
        self.cells[seq] = set(range(max(0, upto - self.window), upto))

    def remove(self, seq: int, p0: int, p1: int) -> bool:
        end = 1 << 30 if p1 < 0 else p1
        self.cells[seq] = {p for p in self.cells.get(seq, set()) if not max(p0, 0) <= p < end}
        return True

    def copy(self, src: int, dst: int) -> None:
        self.cells[dst] = set(self.cells[src])

    def shift(self, seq: int, p0: int, p1: int, delta: int) -> None:
        raise AssertionError("not used")

    def can_shift(self) -> bool:
        return False

    def pos_min(self, seq: int) -> int:
        return min(self.cells.get(seq) or {-1})

    def pos_max(self, seq: int) -> int:
        return max(self.cells.get(seq) or {-1})

    def save(self, seq: int, partial: bool) -> bytes:
        return ",".join(map(str, sorted(self.cells.get(seq, set())))).encode()

    def load(self, seq: int, data: bytes, partial: bool) -> bool:
        self.cells[seq] = {int(p) for p in data.decode().split(",") if p}
        return True


def test_the_last_chunks_of_a_prompt_start_at_the_checkpoint_offsets() -> None:
    # 4 + n_ubatch and 4 tokens before the end (capped at n_batch), as llama-server breaks
    assert RULES.chunk_end(200, 0, 200) == 200 - 20
    assert RULES.chunk_end(200, 180, 200) == 196
    assert RULES.chunk_end(200, 196, 200) == 200
    assert CheckpointRules(n_swa=0).chunk_end(200, 0, 200) == 200  # nothing to roll back


def test_checkpoints_are_taken_near_the_end_and_never_after_media_or_at_the_start() -> None:
    assert RULES.wanted(200, 180, 196, after_media=False)
    assert RULES.wanted(200, 196, 200, after_media=False)
    assert not RULES.wanted(200, 64, 128, after_media=False)  # mid-prompt
    assert not RULES.wanted(200, 0, 196, after_media=False)  # nothing cached yet
    assert not RULES.wanted(200, 196, 200, after_media=True)
    assert not CheckpointRules(n_max=0, n_swa=8).wanted(200, 196, 200, after_media=False)


def test_the_prefill_is_cut_and_checkpointed_at_user_message_starts() -> None:
    # a chat of user messages at 1, 60 and 150 (min_step 100), as server-context.cpp cuts:
    starts = (1, 60, 150)
    # no checkpoint yet: the first user start cuts, and its chunk takes one
    assert RULES.chunk_end(200, 0, 64, starts, []) == 1
    assert RULES.wanted(200, 1, 60, False, starts, [])
    # one at 1: the next (60) is within min_step of it and not the last, so no cut there
    assert RULES.chunk_end(200, 1, 64, starts, [cp(1)]) == 64
    assert not RULES.wanted(200, 60, 124, False, starts, [cp(1)])
    # the last user message always cuts and takes one
    assert RULES.chunk_end(200, 124, 188, starts, [cp(1)]) == 150
    assert RULES.wanted(200, 150, 180, False, starts, [cp(1)])
    # a user start min_step past the last checkpoint does as well
    assert RULES.chunk_end(300, 0, 64, (20, 250), [cp(10)]) == 64
    assert RULES.chunk_end(300, 100, 164, (120, 250), [cp(10)]) == 120
    # the near-the-end offsets still come first when they are nearer
    assert RULES.chunk_end(200, 170, 200, (190,), []) == 180
    # nothing to roll back: no cut, no checkpoint
    assert CheckpointRules(n_swa=0).chunk_end(200, 0, 200, starts, []) == 200
    assert not CheckpointRules(n_swa=0).wanted(200, 1, 60, False, starts, [])


def test_a_full_list_drops_close_ones_of_other_runs_then_the_oldest() -> None:
    checkpoints = [cp(100), cp(150), cp(400)]
    RULES.add(checkpoints, cp(600, task=2))  # full: 150 is within min_step of 100
    assert [c.n_tokens for c in checkpoints] == [100, 400, 600]
    RULES.add(checkpoints, cp(800, task=2))
    RULES.add(checkpoints, cp(1000, task=2))  # 4 max: the oldest goes
    assert [c.n_tokens for c in checkpoints] == [400, 600, 800, 1000]
    RULES.add(checkpoints, cp(1000, task=3))  # room made first, then the same n_tokens
    assert [(c.n_tokens, c.task) for c in checkpoints] == [(600, 2), (800, 2), (1000, 3)]


def test_a_prefix_the_window_still_covers_needs_no_checkpoint() -> None:
    kv = SwaKv(window=12)
    slot = SlotCache(0, list(range(40)))
    kv.decode(0, 40)  # cells 28..39
    prompt = [*range(38), 99]
    assert prepare_slot(kv, [slot], slot, prompt, True, 0, kv, RULES) == 38
    assert slot.tokens == list(range(38))


def test_a_shorter_prefix_restores_the_latest_checkpoint_before_it() -> None:
    kv = SwaKv(window=12)
    slot = SlotCache(0, list(range(40)))
    kv.decode(0, 20)
    take_checkpoint(kv, slot, RULES, 20, task=1)  # cells 8..19
    kv.decode(0, 36)
    take_checkpoint(kv, slot, RULES, 36, task=1)  # cells 24..35
    kv.decode(0, 40)
    prompt = [*range(25), 99]  # shares 25 tokens: the window (28..39) no longer has 17..24
    n = prepare_slot(kv, [slot], slot, prompt, True, 0, kv, RULES)
    # llama-server's pos_next: max(pos_min + 1, pos_max), so the checkpoint's last token
    # is decoded again
    assert n == 19 and slot.tokens == list(range(19))
    assert kv.cells[0] == set(range(8, 19))
    assert [c.n_tokens for c in slot.checkpoints] == [20]  # the one past it went


def test_without_a_covering_checkpoint_the_prompt_is_processed_again() -> None:
    kv = SwaKv(window=12)
    slot = SlotCache(0, list(range(40)))
    kv.decode(0, 40)
    assert restore_prefix(kv, slot, 25, RULES) == 0
    assert prepare_slot(kv, [slot], slot, [*range(25), 99], True, 0, kv, RULES) == 0
    assert slot.tokens == [] and kv.cells[0] == set()


def test_a_checkpoint_travels_with_a_prefix_copied_from_another_slot() -> None:
    kv = SwaKv(window=12)
    donor, slot = SlotCache(0, list(range(60))), SlotCache(1)
    kv.decode(0, 40)
    take_checkpoint(kv, donor, RULES, 40, task=1)
    kv.decode(0, 60)
    kv.cells[1] = set()
    n = prepare_slot(kv, [donor, slot], slot, [*range(45), 99], True, 0, kv, RULES)
    assert n == 39 and kv.cells[1] == set(range(28, 39))
    assert [c.n_tokens for c in donor.checkpoints] == [40]  # the donor keeps its own


def test_a_window_that_still_holds_position_0_lost_nothing() -> None:
    kv = SwaKv(window=64)
    slot = SlotCache(0, list(range(30)))
    kv.decode(0, 30)
    take_checkpoint(kv, slot, RULES, 26, task=1)
    # llama-server would restore the checkpoint (pos_min 0 is not below 0) and keep 25
    assert restore_prefix(kv, slot, 29, RULES) == 29


def test_a_recurrent_state_past_the_prefix_needs_a_checkpoint() -> None:
    rules = CheckpointRules(n_max=4, min_step=100, rollback_only_full=True)
    checkpoints = [Checkpoint(20, 19, 19, b"s")]
    assert rules.restore_point(checkpoints, 25, pos_min=39) == (20, checkpoints[0])
    assert rules.restore_point(checkpoints, 15, pos_min=39) == (0, None)
    assert rules.restore_point(checkpoints, 40, pos_min=39) == (40, None)
