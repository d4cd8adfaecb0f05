// A tool-using agent over the OpenAI chat API with Node's fetch: the task from
// $COEVO_TASK_FILE, the knobs from $COEVO_KNOBS_FILE, the answer (JSON) to $COEVO_ANSWER_FILE,
// the model at $OPENAI_BASE_URL with $OPENAI_API_KEY.
const fs = require("fs");

const task = JSON.parse(fs.readFileSync(process.env.COEVO_TASK_FILE, "utf8"));
const knobs = JSON.parse(fs.readFileSync(process.env.COEVO_KNOBS_FILE, "utf8"));
const tools = [{
  type: "function",
  function: {
    name: "calculate",
    description: "Evaluate an arithmetic expression (+ - * / and parentheses).",
    parameters: {type: "object", properties: {expression: {type: "string"}}, required: ["expression"]},
  },
}];

function calculate(expression) {
  // Digits, operators, parentheses and spaces only: nothing else reaches Function().
  if (!/^[\d\s+\-*/().]+$/.test(expression)) return "error: not arithmetic";
  try { return String(Function(`"use strict"; return (${expression});`)()); }
  catch (e) { return "error: " + e.message; }
}

function lastNumber(text) {
  const found = String(text || "").match(/-?\d+(?:\.\d+)?/g);
  return found ? Number(found[found.length - 1]) : null;
}

async function chat(messages) {
  const response = await fetch(process.env.OPENAI_BASE_URL + "/chat/completions", {
    method: "POST",
    headers: {"Authorization": "Bearer " + process.env.OPENAI_API_KEY, "Content-Type": "application/json"},
    body: JSON.stringify({model: "any", messages, tools, temperature: 0, max_tokens: 256}),
  });
  if (!response.ok) throw new Error(`HTTP ${response.status}: ${await response.text()}`);
  return (await response.json()).choices[0].message;
}

async function main() {
  const messages = [
    {role: "system", content: "Use the calculate tool for arithmetic, then reply with the number alone."},
    {role: "user", content: task.input},
  ];
  let answer = null;
  for (let turn = 0; turn < knobs.max_turns; turn++) {
    const message = await chat(messages);
    messages.push(message);
    if (!message.tool_calls || message.tool_calls.length === 0) {
      const said = lastNumber(message.content);
      if (said !== null) answer = said;  // else the last tool result stands
      break;
    }
    for (const call of message.tool_calls) {
      let args = {};
      try { args = JSON.parse(call.function.arguments || "{}"); } catch (e) { args = {}; }
      const result = call.function.name === "calculate" ? calculate(String(args.expression || "")) : "error: no such tool";
      messages.push({role: "tool", tool_call_id: call.id, content: result});
      if (!result.startsWith("error")) answer = lastNumber(result);
    }
  }
  fs.writeFileSync(process.env.COEVO_ANSWER_FILE, JSON.stringify(answer));
}

main().catch(e => { console.error(e); process.exit(1); });
