"""The step as data (worker/engine/step_plan.py): which runs go and which tokens fill the batch,
without llama.cpp."""

from __future__ import annotations

from worker.engine.step_plan import PromptChunk, RunState, plan_step, runs_that_go


def generating(slot_id: int, n_draft: int = 0, background: bool = False) -> RunState:
    return RunState(slot_id, prefilling=False, background=background, prompt_done=10,
                    n_draft=n_draft)


def prefilling(slot_id: int, done: int, end: int, background: bool = False,
               priority: int = 0) -> RunState:
    return RunState(slot_id, prefilling=True, background=background, prompt_done=done,
                    prompt_end=end, priority=priority)


def test_generating_runs_take_a_token_each_and_their_drafts_before_any_prompt() -> None:
    plan = plan_step([generating(0, n_draft=3), prefilling(1, 0, 100), generating(2)],
                     n_batch=64, background_budget=64)
    assert plan.generate == (0, 2)
    assert plan.prompts == (PromptChunk(1, 0, 59),)  # 64 less 1 + 3 + 1
    assert plan.n_tokens == 64


def test_prompts_fill_the_batch_in_order_and_a_run_with_no_room_has_no_chunk() -> None:
    plan = plan_step([prefilling(0, 5, 40), prefilling(1, 0, 30), prefilling(2, 0, 30)],
                     n_batch=64, background_budget=64)
    assert plan.prompts == (PromptChunk(0, 5, 40), PromptChunk(1, 0, 29))
    assert plan.n_tokens == 64 and plan.generate == ()


def test_a_prompt_stops_at_its_end_for_this_step() -> None:
    plan = plan_step([prefilling(0, 0, 7), prefilling(1, 3, 9)], n_batch=512,
                     background_budget=512)
    assert plan.prompts == (PromptChunk(0, 0, 7), PromptChunk(1, 3, 9))
    assert plan.n_tokens == 13


def test_a_run_at_its_end_puts_nothing_this_step() -> None:
    plan = plan_step([prefilling(0, 7, 7), generating(1)], n_batch=512, background_budget=512)
    assert plan.prompts == () and plan.generate == (1,) and plan.n_tokens == 1


def test_batch_lines_sit_out_while_an_online_prompt_is_evaluated() -> None:
    runs = [generating(0, background=True), prefilling(1, 0, 50),
            prefilling(2, 0, 50, background=True), generating(3)]
    assert [r.slot_id for r in runs_that_go(runs)] == [1, 3]
    online_done = [generating(0, background=True), prefilling(2, 0, 50, background=True),
                   generating(3)]
    assert runs_that_go(online_done) == online_done


def test_batch_lines_prompts_come_after_online_ones_within_their_budget() -> None:
    runs = [prefilling(0, 0, 100, background=True), prefilling(1, 0, 10),
            prefilling(2, 0, 100, background=True)]
    plan = plan_step(runs, n_batch=64, background_budget=20)
    assert plan.prompts == (PromptChunk(1, 0, 10), PromptChunk(0, 0, 20))
    assert plan.n_tokens == 30
    roomy = plan_step(runs, n_batch=64, background_budget=512)  # the batch caps them
    assert roomy.prompts == (PromptChunk(1, 0, 10), PromptChunk(0, 0, 54))


def test_a_more_urgent_prompt_gets_the_budget_first_and_the_batch_keeps_slot_order() -> None:
    """Issue 47 item 4: a priority 0 prompt on slot 2 is not made to wait behind the long
    priority 10 prompts of slots 0 and 1; equal priorities share in slot order."""
    plan = plan_step([prefilling(0, 0, 500, priority=10), prefilling(1, 0, 500, priority=10),
                      prefilling(2, 0, 40), generating(3)], n_batch=64, background_budget=64)
    assert plan.prompts == (PromptChunk(0, 0, 23), PromptChunk(2, 0, 40))
    assert plan.n_tokens == 64
    plan = plan_step([prefilling(0, 0, 30, priority=1), prefilling(1, 0, 30, priority=1),
                      prefilling(2, 0, 30, priority=-1)], n_batch=64, background_budget=64)
    assert plan.prompts == (PromptChunk(0, 0, 30), PromptChunk(1, 0, 4),
                            PromptChunk(2, 0, 30))
