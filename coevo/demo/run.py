"""``coevo demo``: the whole system on one machine, on the embedded default.

Starts the policy server (llama.cpp + Gemma 3 270M, unless COEVO_POLICY_URL is set), a real
Celery worker and the web server; creates a demo project, imports the seed harness and
HumanEval, evaluates the seed on a small search split and prints a one-line summary. Then the
story of harness evolution, start to end:

1. a short config campaign on a few TextWorld games from a deliberately naive seed
   (``examples/textworld-naive``), where the harness visibly moves Gemma's score (docs/architecture.md,
   "Shipped suites"): the seed's scores, the best validation score and what changed (a second
   run in the same home goes on from the earlier campaign's best candidate with a new sampler
   seed: coevo.demo.campaign_start);
2. a promotion of the campaign's best candidate to ``production``: the sealed held-out games
   are played and the evidence assembled (the paired held-out comparison, the gap between the
   search-set gain and the held-out gain);
3. a second login, a reviewer, and the review page where they approve it and the channel
   moves.

It keeps serving until Ctrl-C (or exits once the summaries are printed, with ``--once``).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from coevo.demo.processes import (
    require_free_port,
    running_services,
    say,
    start_policy_and_worker,
)
from coevo.demo.progress import progress_step


@dataclass
class DemoOptions:
    tasks: int = 20
    once: bool = False
    host: str = "127.0.0.1"
    port: int = 8000
    policy_port: int = 8089
    campaign: bool = True
    campaign_proposals: int = 3
    # Games in each of the campaign suite's search, validation and held-out splits.
    campaign_tasks: int = 2
    campaign_max_steps: int = 20
    # None: 6 for the project's first demo campaign, then one no campaign of it used
    # (coevo.demo.campaign_start).
    campaign_seed: int | None = None
    promotion: bool = True
    # The campaign alternates harness and policy steps (coevo.demo.coevolve).
    coevolve: bool = False
    # The policy server: "llamacpp" (the coevo llama.cpp host) or "vllm" (vLLM's CPU build).
    policy: str = "llamacpp"


def run_demo(options: DemoOptions) -> int:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
    child_env = dict(os.environ)
    # llama.cpp answers one request at a time: two rollouts in flight overlap one's sandbox
    # start-up and scoring with the other's model call, and no more would help.
    child_env.setdefault("COEVO_WORKER_CONCURRENCY", "2")
    # This process prints its own progress; the children's logs keep the detail.
    os.environ.setdefault("COEVO_LOG_LEVEL", "WARNING")
    django.setup()
    # The demo's steps import models: they can only be imported once Django is set up.
    from django.conf import settings
    from django.core.management import call_command

    from coevo.demo import campaign as demo_campaigns
    from coevo.demo import coevolve, humaneval, promotion
    from coevo.demo.users import demo_project, demo_user
    from coevo.projects.models import Role
    from workers.sandbox import sandbox_mode

    started = time.monotonic()
    home = Path(settings.COEVO_HOME)
    logs_dir = home / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    say(f"state lives in {home} (COEVO_HOME)")
    sandbox = sandbox_mode()  # refuses clearly when bwrap is missing and not overridden
    say(f"harness sandbox: {sandbox}")

    ports = [("--port", options.port)]
    if "COEVO_POLICY_URL" not in os.environ:
        ports.append(("--policy-port", options.policy_port))
    for flag, port in ports:
        require_free_port(options.host if flag == "--port" else "127.0.0.1", port, flag)

    with progress_step("preparing the database", waiting_on="applying migrations"):
        call_command("migrate", interactive=False, verbosity=0)

    with running_services(logs_dir) as services:
        with progress_step(
            "starting the policy server and the worker",
            waiting_on="waiting for the policy server to list its model",
        ) as step:
            start_policy_and_worker(
                services=services,
                settings=settings,
                policy_port=options.policy_port,
                env=child_env,
                worker_name="demo",
                policy=options.policy,
                # vLLM's start (minutes) in the step's own lines, with its last log line.
                progress=step.update,
                # A policy step's training run goes to the training queue.
                queues=("rollouts", "default", "ops", "training") if options.coevolve else None,
            )
        services.start(
            "web",
            [sys.executable, "-m", "gunicorn", "coevo.wsgi:application",
             "--bind", f"{options.host}:{options.port}", "--workers", "2", "--timeout", "60"],
            child_env,
        )  # fmt: skip
        project = demo_project()
        user, password = demo_user(project=project, home=home, username="demo", role=Role.ADMIN)
        login = f"(login {user.username} / {password})"
        with progress_step(
            "importing the seed harness and HumanEval", waiting_on="importing HumanEval"
        ):
            evaluation = humaneval.demo_evaluation(project=project, user=user, tasks=options.tasks)
        base = f"http://{options.host}:{options.port}"
        url = f"{base}/p/{project.slug}/e/{evaluation.id}/"
        say(f"evaluating the seed harness on {options.tasks} HumanEval search tasks")
        say(f"watch it live: {url} {login}")
        eval_started = time.monotonic()
        humaneval.wait_for_evaluation(evaluation, services)
        print(humaneval.evaluation_summary(evaluation, time.monotonic() - eval_started), flush=True)
        print(f"Dashboard: {url}  {login}", flush=True)
        preparing = progress_step(
            "preparing the campaign", waiting_on="importing the TextWorld games and the seed"
        )
        if options.campaign and options.coevolve:
            with preparing:
                campaign = coevolve.demo_coevolve_campaign(
                    project=project,
                    user=user,
                    games=options.campaign_tasks,
                    max_steps=options.campaign_max_steps,
                    seed=options.campaign_seed,
                )
        elif options.campaign:
            with preparing:
                campaign = demo_campaigns.demo_campaign(
                    project=project,
                    user=user,
                    games=options.campaign_tasks,
                    max_steps=options.campaign_max_steps,
                    proposals=options.campaign_proposals,
                    seed=options.campaign_seed,
                )
        if options.campaign:
            campaign_url = f"{base}/p/{project.slug}/campaigns/{campaign.id}/"
            server = {"vllm": "vLLM", "llamacpp": "llama.cpp"}.get(
                settings.COEVO_POLICY_KIND, "the policy server"
            )
            what = (
                f"co-evolution on TextWorld from {campaign.seed_candidate.short_sha}: a harness "
                f"step (a config proposal), a policy step (a LoRA trained on the CPU, served by "
                f"{server}), a harness step under the new policy"
                if options.coevolve
                else f"config campaign on TextWorld from {campaign.seed_candidate.short_sha}: "
                f"up to {options.campaign_proposals} proposals"
            )
            say(
                f"{what}; knobs {', '.join(demo_campaigns.CAMPAIGN_KNOBS)}; "
                f"{options.campaign_tasks} search and {options.campaign_tasks} validation "
                f"games, {options.campaign_max_steps} steps a game (seed {campaign.seed})"
            )
            say(f"watch it live: {campaign_url}")
            campaign_started = time.monotonic()
            try:
                demo_campaigns.wait_for_campaign(campaign, services)
            except KeyboardInterrupt:
                # Left running, the next demo's worker would go on with it unseen.
                from coevo.campaigns.services import campaign_stop

                print()
                campaign_stop(campaign=campaign, reason="the demo was interrupted")
                say(f"stopped the campaign; its proposals so far are at {campaign_url}")
                return 130
            summary = demo_campaigns.campaign_summary(campaign, time.monotonic() - campaign_started)
            for line in summary:
                print(line, flush=True)
            print(f"Campaign dashboard: {campaign_url}  {login}", flush=True)
            if options.coevolve:
                for line in coevolve.coevolve_summary(campaign):
                    print(line, flush=True)
                with progress_step("creating the harness x policy matrix"):
                    matrix = coevolve.demo_matrix(campaign=campaign, user=user)
                if matrix is not None:
                    matrix_url = f"{base}/p/{project.slug}/matrices/{matrix.id}/"
                    say(f"harness x policy matrix: {matrix_url}")
                    coevolve.wait_for_matrix(matrix, services)
                    for line in coevolve.matrix_summary(matrix):
                        print(line, flush=True)
                    print(f"Matrix: {matrix_url}  {login}", flush=True)
            request = None
            if options.promotion:
                with progress_step(
                    "requesting the promotion", waiting_on="sealing the held-out games"
                ):
                    request = promotion.demo_promotion(campaign=campaign, requester=user)
            if request is not None:
                reviewer, reviewer_password = promotion.demo_reviewer(project=project, home=home)
                review_url = f"{base}/p/{project.slug}/promotions/{request.id}/"
                say(f"watch it live: {review_url}")
                promotion.wait_for_promotion(request, services)
                for line in promotion.promotion_summary(request, review_url):
                    print(line, flush=True)
                print(
                    f"Review: {review_url}  (approve as {reviewer.username} / "
                    f"{reviewer_password}; requested by {user.username}, who may not approve "
                    "their own request)",
                    flush=True,
                )
        say(f"total time {time.monotonic() - started:.0f}s")
        if options.once:
            return 0
        say("serving until Ctrl-C")
        try:
            while True:
                services.check_alive()
                time.sleep(1)
        except KeyboardInterrupt:
            say("stopping")
    return 0
