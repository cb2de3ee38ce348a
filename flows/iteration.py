"""One eva iteration, as the paper's Algorithm 1 reads.

Creator step on X_{t-1} with pi_{theta_{t-1}}: generate, annotate, score informativeness,
sample a subset, evolve it, mix evolved and original prompts into X_t.
Solver step on X_t: generate, annotate, build best-vs-worst pairs, train theta_t from
theta_{t-1}, evaluate theta_t on the held-out set (and, with ``evaluate.judge``, judge its
answers against the run's reference answers).
"""

from typing import NamedTuple

from prefect import flow

from flows.config import OnlineRunConfig, RunConfig
from tasks.annotate import annotate
from tasks.backends.judge.reference import for_heldout
from tasks.bootstrap import bootstrap
from tasks.complexity import complexity
from tasks.context import RunContext
from tasks.evaluate import evaluate
from tasks.evolve import evolve
from tasks.generate import generate
from tasks.judge import judge
from tasks.mix import mix
from tasks.pairs import pairs
from tasks.predict import predict
from tasks.prompts import load_heldout, load_prompts
from tasks.reference import reference
from tasks.sample import sample
from tasks.score import score
from tasks.store import Ref
from tasks.train import train


class Setup(NamedTuple):
    prompts: Ref  # X_0 (online: the seed set D)
    heldout: Ref
    policy: Ref  # theta_0
    reference: Ref | None  # the reference answers the judge compares with (None: no judge)


def setup(run: RunContext, cfg: RunConfig | OnlineRunConfig) -> Setup:
    """X_0, the held-out set (disjoint from it), theta_0, and theta_0's held-out score: what
    every run starts from; with a judge, the reference answers and theta_0's win rate."""
    prompts = load_prompts(run, None, cfg.prompts)
    heldout = load_heldout(run, None, cfg.heldout, seed_set=prompts)
    policy = bootstrap(run, None, cfg.bootstrap, heldout=heldout)
    evaluated = evaluate(run, None, cfg.evaluation.without_judge(), heldout=heldout, policy=policy)
    answers = None
    if (judged := cfg.evaluation.judge) is not None:
        source = for_heldout(judged.reference, cfg.heldout)
        answers = reference(run, None, source, heldout=heldout)
        judge(run, None, judged.without_reference(), evaluated=evaluated, reference=answers)
    return Setup(prompts, heldout, policy, answers)


class Step(NamedTuple):
    prompts: Ref  # X_t
    policy: Ref  # theta_t
    rollouts: Ref  # the solver's annotated rollouts on X_t (by theta_{t-1})


def solver_step(
    run: RunContext,
    t: int,
    cfg: RunConfig,
    prompts: Ref,
    policy: Ref,
    heldout: Ref,
    answers: Ref | None = None,
) -> Step:
    """theta_t = solver(theta_{t-1}, pairs on X_t); ``answers``: the reference answers the
    judge compares theta_t's with (None: no judge)."""
    rollouts = generate(run, t, cfg.generate, prompts=prompts, policy=policy)
    rewarded = annotate(run, t, cfg.annotate, rollouts=rollouts)
    preference_pairs = pairs(run, t, cfg.pairs, annotated=rewarded)
    new_policy = train(run, t, cfg.train, pairs=preference_pairs, policy=policy)
    evaluated = evaluate(run, t, cfg.evaluation.without_judge(), heldout=heldout, policy=new_policy)
    if (judged := cfg.evaluation.judge) is not None and answers is not None:
        judge(run, t, judged.without_reference(), evaluated=evaluated, reference=answers)
    return Step(prompts, new_policy, rewarded)


# The parameters are the run's own objects, its config validated once at the edge
# (flows.inputs): Prefect's per-call validation would rebuild them through pydantic again.
@flow(name="eva-iteration", flow_run_name="{run.run}-iter-{t}", validate_parameters=False)
def eva_iteration(
    run: RunContext,
    t: int,
    cfg: RunConfig,
    prompts: Ref,
    policy: Ref,
    heldout: Ref,
    last_rollouts: Ref | None = None,
    older_rollouts: Ref | None = None,
    answers: Ref | None = None,
) -> Step:
    """Creator then solver on X_t. ``last_rollouts`` are the last solver step's annotated
    rollouts of X_{t-1}, ``older_rollouts`` the step before's, of X_{t-2}; ``answers`` the
    reference answers of the judge (None: no judge)."""
    # Creator: where is the current policy still learning?
    if cfg.creator_rollouts == "predicted" and last_rollouts is not None:
        # No generation: a posterior over the solver's readings of each prompt (at iteration 1
        # there is one reading, so the same rollouts stand for both).
        older = older_rollouts if older_rollouts is not None else last_rollouts
        scores = predict(
            run, t, cfg.prediction, artifact="score", recent=last_rollouts, older=older
        )
    else:
        if cfg.creator_rollouts == "previous" and last_rollouts is not None:
            # The last solver step already sampled X_{t-1}, by theta_{t-2}: one step
            # off-policy, and no extra generation.
            rewarded = last_rollouts
        else:
            rollouts = generate(
                run, t, cfg.generate, artifact="creator_generate", prompts=prompts, policy=policy
            )
            rewarded = annotate(
                run, t, cfg.annotate, artifact="creator_annotate", rollouts=rollouts
            )
        scores = score(run, t, cfg.score, annotated=rewarded)
    subset = sample(run, t, cfg.sample, scores=scores)
    if cfg.prompt_strategy == "subset":  # ablation: the informative prompts, not evolved
        next_prompts = subset
    else:
        evolved = evolve(run, t, cfg.evolve, subset=subset, heldout=heldout)
        next_prompts = mix(run, t, cfg.mix, current=prompts, evolved=evolved)
    if cfg.complexity is not None:  # inspection only: nothing downstream reads it
        complexity(run, t, cfg.complexity, prompts=next_prompts)
    # Solver: learn on the new prompt set.
    return solver_step(run, t, cfg, next_prompts, policy, heldout, answers)


@flow(name="eva-dpo-iteration", flow_run_name="{run.run}-iter-{t}", validate_parameters=False)
def dpo_iteration(
    run: RunContext,
    t: int,
    cfg: RunConfig,
    prompts: Ref,
    policy: Ref,
    heldout: Ref,
    answers: Ref | None = None,
) -> Step:
    """Plain iterative DPO on a given prompt set (iteration 0, the paper's theta_0 -> theta_1,
    and the fresh-seed-split baseline)."""
    return solver_step(run, t, cfg, prompts, policy, heldout, answers)
