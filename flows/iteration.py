"""One eva iteration, as the paper's Algorithm 1 reads.

Creator step on X_{t-1} with pi_{theta_{t-1}}: generate, annotate, score informativeness,
sample a subset, evolve it, mix evolved and original prompts into X_t.
Solver step on X_t: generate, annotate, build best-vs-worst pairs, train theta_t from
theta_{t-1}, evaluate theta_t on the held-out set.
"""

from prefect import flow

from flows.config import RunConfig
from tasks.annotate import annotate
from tasks.evaluate import evaluate
from tasks.evolve import evolve
from tasks.generate import generate
from tasks.mix import mix
from tasks.pairs import pairs
from tasks.sample import sample
from tasks.score import score
from tasks.stage import RunContext
from tasks.store import Ref
from tasks.train import train


def solver_step(
    run: RunContext, t: int, cfg: RunConfig, prompts: Ref, policy: Ref, heldout: Ref
) -> Ref:
    """theta_t = solver(theta_{t-1}, pairs on X_t); returns the new policy."""
    rollouts = generate(run, t, cfg.generate, prompts=prompts, policy=policy)
    rewarded = annotate(run, t, cfg.annotate, rollouts=rollouts)
    preference_pairs = pairs(run, t, cfg.pairs, annotated=rewarded)
    new_policy = train(run, t, cfg.train, pairs=preference_pairs, policy=policy)
    evaluate(run, t, cfg.evaluate, heldout=heldout, policy=new_policy)
    return new_policy


@flow(name="eva-iteration", flow_run_name="{run.run}-iter-{t}")
def eva_iteration(
    run: RunContext, t: int, cfg: RunConfig, prompts: Ref, policy: Ref, heldout: Ref
) -> tuple[Ref, Ref]:
    """Creator then solver; returns (X_t, theta_t)."""
    # Creator: where is the current policy still learning?
    rollouts = generate(
        run, t, cfg.generate, artifact="creator_generate", prompts=prompts, policy=policy
    )
    rewarded = annotate(run, t, cfg.annotate, artifact="creator_annotate", rollouts=rollouts)
    scores = score(run, t, cfg.score, annotated=rewarded)
    subset = sample(run, t, cfg.sample, scores=scores)
    evolved = evolve(run, t, cfg.evolve, subset=subset)
    next_prompts = mix(run, t, cfg.mix, current=prompts, evolved=evolved)
    # Solver: learn on the new prompt set.
    return next_prompts, solver_step(run, t, cfg, next_prompts, policy, heldout)


@flow(name="eva-dpo-iteration", flow_run_name="{run.run}-iter-{t}")
def dpo_iteration(
    run: RunContext, t: int, cfg: RunConfig, prompts: Ref, policy: Ref, heldout: Ref
) -> Ref:
    """Plain iterative DPO on a fixed prompt set (iteration 0, the paper's theta_0 -> theta_1)."""
    return solver_step(run, t, cfg, prompts, policy, heldout)
