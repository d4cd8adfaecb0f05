"""``coevo demo``: the whole system on one machine, on the embedded default."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(commands: Any) -> None:
    demo = commands.add_parser(
        "demo",
        help="run the whole system on the embedded default: evaluate a seed harness, evolve "
        "a naive TextWorld harness with a short config campaign, and request the promotion of "
        "its best candidate for a second login to review",
    )
    demo.add_argument("--tasks", type=int, default=20, help="search-split tasks to evaluate")
    demo.add_argument("--once", action="store_true", help="exit after the summary")
    demo.add_argument("--host", default="127.0.0.1")
    demo.add_argument("--port", type=int, default=8000, help="web server port")
    demo.add_argument("--policy-port", type=int, default=8089, help="policy server port")
    demo.add_argument(
        "--policy",
        choices=("llamacpp", "vllm"),
        default="llamacpp",
        help="the policy server: the coevo llama.cpp host (default), or vLLM's CPU build "
        "(scripts/demo installs it into an environment of its own once: about 3 to 6 minutes "
        "and 3.5 GB; it starts in about 2 minutes and takes about 7 GB of memory)",
    )
    campaign = demo.add_argument_group("the TextWorld config campaign (after the evaluation)")
    campaign.add_argument(
        "--no-campaign", dest="campaign", action="store_false", help="skip the campaign"
    )
    campaign.add_argument(
        "--campaign-proposals", type=int, default=3, help="proposals after the seed (default 3)"
    )
    campaign.add_argument(
        "--campaign-tasks",
        type=int,
        default=2,
        help="games in each of the search, validation and held-out splits (default 2)",
    )
    campaign.add_argument(
        "--campaign-max-steps", type=int, default=20, help="step limit per game (default 20)"
    )
    campaign.add_argument(
        "--campaign-seed",
        type=int,
        default=None,
        help="seeds the Optuna sampler and the evaluations (default: 6 for the first demo "
        "campaign, whose first draw tries order = priority, with 0 the first three draws keep "
        "the game's order; a later run starts from the earlier campaign's best candidate and "
        "takes the next seed no campaign of the project used, since the same seed would draw "
        "the same settings again)",
    )
    campaign.add_argument(
        "--coevolve",
        action="store_true",
        help="co-evolve harness and policy: the campaign takes a harness step, a policy step "
        "(a LoRA adapter trained on the CPU on the best candidate's search games, served by "
        "the policy server: llama.cpp, or vLLM with --policy vllm) and a harness step under the "
        "new policy, then shows the harness x policy matrix (needs the train extra: "
        "scripts/demo --coevolve installs it)",
    )
    campaign.add_argument(
        "--no-promotion",
        dest="promotion",
        action="store_false",
        help="do not request the promotion of the campaign's best candidate to production",
    )
    demo.set_defaults(handler=run)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from coevo.demo.run import DemoOptions, run_demo
    from coevo.errors import CoevoError

    if args.tasks < 1:
        parser.error("--tasks must be at least 1")
    if args.campaign_proposals < 1:
        parser.error("--campaign-proposals must be at least 1")
    if args.coevolve and not args.campaign:
        parser.error("--coevolve runs the campaign: drop --no-campaign")
    if args.campaign_tasks < 1:
        parser.error("--campaign-tasks must be at least 1")
    try:
        return run_demo(
            DemoOptions(
                tasks=args.tasks,
                once=args.once,
                host=args.host,
                port=args.port,
                policy_port=args.policy_port,
                campaign=args.campaign,
                campaign_proposals=args.campaign_proposals,
                campaign_tasks=args.campaign_tasks,
                campaign_max_steps=args.campaign_max_steps,
                campaign_seed=args.campaign_seed,
                promotion=args.promotion,
                coevolve=args.coevolve,
                policy=args.policy,
            )
        )
    except CoevoError as exc:
        print(f"coevo: {exc}", file=sys.stderr)
        return 1
