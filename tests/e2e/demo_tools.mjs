// The demo model's tools (tools/train/agent_tools.json), executed here so that
// the API tests' agent loops can run to a final answer.
export function executeTool(name, argsText) {
  let args;
  try {
    args = JSON.parse(argsText);
  } catch {
    return 'error: arguments are not JSON';
  }
  const num = (v) => Number(v);
  switch (name) {
    case 'add':
      return String(num(args.a) + num(args.b));
    case 'multiply':
      return String(num(args.a) * num(args.b));
    case 'days_between': {
      const d = (s) => Date.parse(`${s}T00:00:00Z`);
      return String(Math.round((d(args.end) - d(args.start)) / 86400000));
    }
    case 'weekday':
      return ['Sunday', 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday'][
        new Date(`${args.date}T00:00:00Z`).getUTCDay()
      ];
    case 'count_word':
      return String(String(args.word ?? '').length * 7);
    case 'search_verses':
      return 'Genesis 1:1 In the beginning God created the heaven and the earth.';
    default:
      return 'unknown tool';
  }
}
