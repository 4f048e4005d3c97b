"""The extractor beside the actor (`complementary.extractor_async: true`): Complementary RL (arXiv 2603.17621)
runs its experience extractor asynchronously so that the actor's rollouts never wait for it. Here the extractor's
step (hook.py: observe, distil, pair, train, consolidate) of step k runs in one worker thread while the trainer
plays and trains step k+1:

    after the sync of step k   wait for the work of step k-1, install its bank (and keep its metrics for this
                               step's row); copy the actor's weights (after step k) into the worker's own actor
                               copy; start the work of step k on a copy of the installed bank
    step k+1                   the actor plays with the installed bank (that of step k-1): the bank lag is 1
    after the sync of step k+1 the same: the work of step k is joined and its bank installed

So every rollout sees the bank one step older than the synchronous hook would show it (complementary/bank_lag = 1
from step 2; 0 at step 1, where nothing has run), never older: a step waits for the work it would otherwise
overtake. The extractor/*, bank/* and complementary/with_minus_without metrics of step k+1 are those of the work on
step k's batch (the last step's work is joined at its checkpoint and at close, its metrics not logged).

*Inferred* (the abstract says the extractor runs asynchronously, not how): the lag of one step, the join after the
next sync, and that the actor's held-out evaluation uses the installed (lagged) bank.

What makes it deterministic and exactly resumable:
- the worker touches nothing the trainer thread uses while it runs: its own copy of the bank, its own copy of the
  actor's weights (the trainer's module is updated meanwhile), its own tokenizer (a fast tokenizer is not safe to
  share between threads), the extractor's engine (only the worker trains or samples it);
- it draws no number from torch's global RNG, which the trainer thread forks and reseeds at every generate call:
  both of its samplers (the extractor's lessons and the paired episodes) draw each row from its own seed
  (`HFBackend(per_sample_seeds=True)`), so its lessons and paired episodes differ from the synchronous hook's
  draws (another stream of the same seeds) and do not depend on timing;
- a checkpoint joins the work in flight and saves its result beside the installed bank (`state_dict`), so a
  resumed run installs at its next step exactly what the uninterrupted run installs; the extractor's engine is
  saved after that join (the hook's `save_files`).
The worker runs torch with the run's intra-op threads (run.threads), beside the trainer's: on a machine with as
many cores as run.threads the two compete for them (docs/performance.md measures it).
"""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from credo.families.complementary.bank import ExperienceBank


@dataclass
class Finished:
    """The extractor's work on one step's batch: the bank it left and the metrics it reported."""

    step: int
    bank: ExperienceBank
    metrics: dict


class Beside:
    """At most one extractor step in flight (a worker thread), and the finished one not yet installed."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="credo-extractor")
        self.future = None
        self.running: tuple[int, ExperienceBank] | None = None  # (step, the bank the work in flight changes)
        self.done: Finished | None = None

    def submit(self, step: int, bank: ExperienceBank, work) -> None:
        """Run `work()` (-> metrics) in the worker; it changes `bank`, which no other thread may touch."""
        if self.future is not None or self.done is not None:
            raise RuntimeError(f"extractor work of step {step} submitted before the previous one was installed")
        self.running = (step, bank)
        self.future = self.pool.submit(work)

    def join(self) -> Finished | None:
        """Wait for the work in flight (its exception is raised here, in the trainer's thread); the finished work."""
        if self.future is not None:
            future, (step, bank) = self.future, self.running
            self.future = self.running = None
            self.done = Finished(step, bank, future.result())
        return self.done

    def take(self) -> Finished | None:
        """`join`, and hand the finished work over (to be installed)."""
        done, self.done = self.join(), None
        return done

    def state_dict(self) -> dict:
        """The finished work not yet installed (joined first), as JSON."""
        done = self.join()
        return {} if done is None else {"step": done.step, "bank": done.bank.state_dict(),
                                        "metrics": dict(done.metrics)}

    def load_state_dict(self, state: dict, new_bank) -> None:
        self.join()
        self.done = None
        if state:
            bank = new_bank()
            bank.load_state_dict(state["bank"])
            self.done = Finished(int(state["step"]), bank, dict(state["metrics"]))

    def close(self) -> None:
        future, self.future = self.future, None
        if future is not None:
            future.exception()  # wait; an error of work nobody will install is not raised at close
        self.pool.shutdown(wait=True)


def worker_source(source, bank: ExperienceBank, backend, tokenizer):
    """The rollout source as the worker sees it: the same env, seeds and settings, but `bank` for lookups, `backend`
    (the worker's actor copy) for the paired episodes and its own tokenizer. A shallow copy: the attributes it
    assigns (bank, backend, generate_calls) stay its own."""
    view = copy.copy(source)
    view.bank, view.backend, view.tokenizer = bank, backend, tokenizer
    view._keys = dict(source._keys)
    return view
