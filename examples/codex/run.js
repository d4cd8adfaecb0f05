// Codex CLI, unmodified, on a workspace task: the instruction from $COEVO_TASK_FILE, the knobs
// from $COEVO_KNOBS_FILE, `codex exec` in the workspace against the worker's Responses endpoint,
// its last message as the answer in $COEVO_ANSWER_FILE.
const fs = require("fs");
const os = require("os");
const path = require("path");
const {spawnSync} = require("child_process");

const task = JSON.parse(fs.readFileSync(process.env.COEVO_TASK_FILE, "utf8"));
const knobs = JSON.parse(fs.readFileSync(process.env.COEVO_KNOBS_FILE, "utf8"));
const workspace = task.workspace || process.env.COEVO_WORKSPACE || "/app";
const instruction = task.instruction || task.input || JSON.stringify(task);

// The package's own launcher: it finds the native binary in the platform's optional package
// (@openai/codex-linux-x64 here) and execs it; it needs no install script.
const launcher = require.resolve("@openai/codex/bin/codex.js", {
  paths: (process.env.NODE_PATH || "").split(":").filter(Boolean),
});

// TOML basic strings take JSON's escapes.
const str = (value) => JSON.stringify(String(value));

// Codex keeps its state (config, logs, its sqlite database) in CODEX_HOME, which must be
// writable: the sandbox's /tmp, private to the rollout. It warns that it makes no helper
// links under a temporary directory; commands run all the same.
const home = fs.mkdtempSync(path.join(os.tmpdir(), "codex-home-"));
const config = [
  // A name Codex has no metadata for, on purpose: its fallback offers function tools only.
  // Names it knows change the tool set to ones no policy server behind the boundary can run
  // (a freeform `custom` apply_patch for gpt-5.5, tools inside an input item for gpt-6.x), and
  // the boundary refuses those requests (400).
  `model = "coevo"`,
  `model_provider = "coevo"`,
  `model_reasoning_effort = ${str(knobs.reasoning_effort)}`,
  `model_context_window = ${Number(knobs.context_window)}`,
  // Commands and edits without asking, and without Codex's own sandbox (landlock, seccomp,
  // its bundled bwrap), which cannot nest in coevo's: coevo's sandbox is the boundary.
  `approval_policy = "never"`,
  `sandbox_mode = "danger-full-access"`,
  // Built-in tools the boundary refuses (web_search is run by OpenAI's servers; the sandbox
  // has no network either).
  `web_search = "disabled"`,
  // What Codex would otherwise send elsewhere or keep: the update check, analytics, feedback
  // uploads, OpenTelemetry export, the prompt history.
  `check_for_update_on_startup = false`,
  "",
  "[analytics]",
  "enabled = false",
  "",
  "[feedback]",
  "enabled = false",
  "",
  "[otel]",
  `exporter = "none"`,
  "",
  "[history]",
  `persistence = "none"`,
  "",
  // Sub-agents (their tools come as a `namespace` tool, which the boundary refuses) and goals:
  // tools and threads beyond one agent loop.
  "[agents]",
  "enabled = false",
  "",
  "[features]",
  "goals = false",
  // Without this Codex retries a refused connection forever; the boundary is local, so a
  // refusal means the rollout has ended.
  "unbounded_connection_retries = false",
  "",
  // Codex's bundled skills (a skill creator and installer, image generation, OpenAI's docs, a
  // review agent, a status-line maker: workflows for its users, not for the task) are copied
  // into CODEX_HOME (530 KB) on every start and listed in a developer message of their own;
  // off unless the skills knob is on.
  "[skills]",
  `include_instructions = ${knobs.skills ? "true" : "false"}`,
  "",
  "[skills.bundled]",
  `enabled = ${knobs.skills ? "true" : "false"}`,
  "",
  // The worker's Responses endpoint. Codex's own retries are off: the boundary retries the
  // policy server, and what reaches Codex is a refusal that would repeat (a limit, a 400).
  "[model_providers.coevo]",
  `name = "coevo"`,
  `base_url = ${str(process.env.OPENAI_BASE_URL)}`,
  `env_key = "OPENAI_API_KEY"`,
  `wire_api = "responses"`,
  "request_max_retries = 0",
  "stream_max_retries = 0",
  "",
].join("\n");
fs.writeFileSync(path.join(home, "config.toml"), config);

const last = path.join(home, "last-message.txt");
const args = [
  launcher,
  "exec",
  // Refuse a config key this Codex does not know rather than ignore it.
  "--strict-config",
  "--skip-git-repo-check",
  // No session files: the trace is the record.
  "--ephemeral",
  "--color", "never",
  "--json",
  "--cd", workspace,
  "--output-last-message", last,
  "--", instruction,
];

const run = spawnSync(process.execPath, args, {
  cwd: workspace,
  env: {...process.env, CODEX_HOME: home},
  // Codex reads more of the prompt from stdin when it is not a terminal: it gets none.
  stdio: ["ignore", "pipe", "inherit"],
  maxBuffer: 256 * 1024 * 1024,
});
const out = (run.stdout || Buffer.alloc(0)).toString();
process.stdout.write(out.slice(-16384));  // its JSONL events: the trace keeps the last 16 KiB
// A turn that failed on the boundary's refusal (the policy server refused a conversation past
// its context, say: Codex passes the error body on, OpenAI's `{"error": {…}}`) is Codex's own
// end of the run, as an exception is mini-swe-agent's: the workspace is judged as it stands.
// Anything else (no connection, no turn at all, a crash) is the harness's failure.
const events = out.split("\n").flatMap((line) => {
  try { return [JSON.parse(line)]; } catch (e) { return []; }
});
const failed = events.find((event) => event && event.type === "turn.failed");
let refused = false;
try { refused = typeof JSON.parse(failed.error.message).error === "object"; } catch (e) { refused = false; }
// So is a turn the model could not finish: its reply cut at the token limit (a small policy
// whose context Codex's own prompt nearly fills).
const message = (failed && failed.error && failed.error.message) || "";
refused = refused || message.startsWith("Incomplete response returned");
if (run.status !== 0 && !refused) {
  console.error(`codex exited with ${run.status === null ? run.signal : run.status}`);
  process.exit(1);
}
if (refused) console.error(`codex's turn failed on the policy's reply (${message.slice(0, 200)}); the workspace is judged`);
const answer = fs.existsSync(last) ? fs.readFileSync(last, "utf8").trim() : "";
fs.writeFileSync(process.env.COEVO_ANSWER_FILE, JSON.stringify(answer));
