// Claude Code, unmodified, on a workspace task: the instruction from $COEVO_TASK_FILE, the
// knobs from $COEVO_KNOBS_FILE, `claude -p` in the workspace, its JSON result (the final text)
// as the answer in $COEVO_ANSWER_FILE. Claude Code reads ANTHROPIC_BASE_URL and
// ANTHROPIC_API_KEY, which the runtime sets to the worker's Messages endpoint.
const fs = require("fs");
const path = require("path");
const {spawnSync} = require("child_process");

const task = JSON.parse(fs.readFileSync(process.env.COEVO_TASK_FILE, "utf8"));
const knobs = JSON.parse(fs.readFileSync(process.env.COEVO_KNOBS_FILE, "utf8"));
const workspace = task.workspace || process.env.COEVO_WORKSPACE || "/app";
const instruction = task.instruction || task.input || JSON.stringify(task);

// The package's own launcher for installs without its postinstall (which the worker never
// runs): it finds the native binary in the platform's optional package and execs it.
const launcher = require.resolve("@anthropic-ai/claude-code/cli-wrapper.cjs", {
  paths: (process.env.NODE_PATH || "").split(":").filter(Boolean),
});

const args = [
  launcher,
  "-p", instruction,
  "--output-format", "json",
  "--max-turns", String(knobs.max_turns),
  "--model", knobs.model,
  // Edits and commands without asking: there is nobody to ask, and the sandbox is the boundary.
  "--permission-mode", "bypassPermissions",
  "--no-session-persistence",
];
if (knobs.bare) args.push("--bare");

const env = {
  ...process.env,
  // What Claude Code would otherwise send elsewhere (the sandbox has no network, so each would
  // only fail and be retried): telemetry, error reports, update checks, other non-essential
  // traffic. IS_SANDBOX lets bypassPermissions run where the sandbox's uid is 0.
  DISABLE_TELEMETRY: "1",
  DISABLE_ERROR_REPORTING: "1",
  DISABLE_AUTOUPDATER: "1",
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
  IS_SANDBOX: "1",
  // Each call's max_tokens (Claude Code's own default is the model's whole output window).
  CLAUDE_CODE_MAX_OUTPUT_TOKENS: String(knobs.max_output_tokens),
};

const run = spawnSync(process.execPath, args, {
  cwd: workspace,
  env,
  stdio: ["ignore", "pipe", "inherit"],
  maxBuffer: 64 * 1024 * 1024,
});
const out = (run.stdout || Buffer.alloc(0)).toString();
process.stdout.write(out.slice(-8000));
let result = null;
try { result = JSON.parse(out.trim().split("\n").pop()); } catch (e) { result = null; }
// Claude Code's own ends, each with a non-zero exit, leave the workspace to be judged as it
// stands: its turn limit (the knob max_turns: subtype "error_max_turns", terminal_reason
// "max_turns"), as mini-swe-agent's step limit ends that agent; and the policy's refusal (a
// conversation past the policy's context: terminal_reason "prompt_too_long", an API error
// status 400), as an exception is mini-swe-agent's. Anything else (no result, a crash, a
// connection that never answered) is the harness's failure.
const isResult = result !== null && result.type === "result";
const turnsEnded = isResult && result.subtype === "error_max_turns";
const policyEnded = isResult &&
  (result.terminal_reason === "prompt_too_long" || result.api_error_status === 400);
if ((run.status !== 0 && !turnsEnded && !policyEnded) || result === null) {
  console.error(`claude exited with ${run.status === null ? run.signal : run.status}`);
  process.exit(1);
}
if (turnsEnded) {
  console.error(`claude stopped at its own --max-turns (${knobs.max_turns}); the workspace is judged`);
} else if (policyEnded) {
  console.error(`claude ended on the policy's refusal (${result.terminal_reason}, ${result.api_error_status}); the workspace is judged`);
}
fs.writeFileSync(process.env.COEVO_ANSWER_FILE, JSON.stringify(result.result ?? ""));
