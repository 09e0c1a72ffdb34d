// Deterministic corpus of test strings for the tokenizer golden file.
//
//   const { buildCorpus } = require("./corpus");
//   buildCorpus(seed) -> [{ category, text }, ...]
//
// The same seed always gives the same strings (a seeded mulberry32 PRNG; no
// Math.random, no clock). Categories: english, chinese, code, emoji,
// whitespace, digits, multilingual, nfc, special, edge, random, long.
//
// Characters the JavaScript encoder treats differently from Hugging Face's
// Rust/Oniguruma tokenizer (and swaserve's) are filtered out (sanitize()):
// U+0085 and U+FEFF (JS \s disagrees) and "'" followed by U+017F (JS has no
// Unicode case folding for (?i:'s)). Random characters come only from
// long-established blocks, so that Unicode-version differences between
// Node's ICU and utf8proc cannot change a character's class.
"use strict";

function mulberry32(seed) {
  let a = seed >>> 0;
  return function () {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

class Rng {
  constructor(seed) {
    this.next = mulberry32(seed);
  }
  int(lo, hi) {  // inclusive
    return lo + Math.floor(this.next() * (hi - lo + 1));
  }
  pick(arr) {
    return arr[Math.floor(this.next() * arr.length)];
  }
  chance(p) {
    return this.next() < p;
  }
}

const WORDS = (
  "the of and to in is that it was for on are as with his they at be this " +
  "have from or one had by word but not what all were we when your can said " +
  "there use an each which she do how their if will up other about out many " +
  "then them these so some her would make like him into time has look two " +
  "more write go see number no way could people my than first water been " +
  "call who oil its now find long down day did get come made may part over " +
  "new sound take only little work know place year live me back give most " +
  "very after thing our just name good sentence man think say great where " +
  "help through much before line right too mean old any same tell boy follow " +
  "came want show also around form three small set put end does another well " +
  "large must big even such because turn here why ask went men read need land " +
  "different home us move try kind hand picture again change off play spell " +
  "air away animal house point page letter mother answer found study still " +
  "learn should America world tokenizer serving cluster latency throughput " +
  "attention window sliding prefix cache Transformer GPU kernel batch decode " +
  "prefill speculative draft accepted rejected quantization bfloat16 " +
  "internationalization antidisestablishmentarianism supercalifragilistic " +
  "naïve café résumé coöperate façade jalapeño Zürich Straße Ångström"
).split(" ");

const CONTRACTIONS = [
  "don't", "I'm", "we'll", "they've", "she'd", "it's", "can't", "won't",
  "you're", "I'D", "WE'LL", "THEY'RE", "It'S", "O'Neil", "rock'n'roll",
  "'tis", "y'all", "'90s", "ma'am", "students'", "James's", "'S", "'ll", "'Ve",
];

const PUNCT = [",", ".", "!", "?", ";", ":", " -", " —", "...", "!?", ")", "\"",
               "'", " (", " [", "]", "…", "''", "``", ".\"", "?!", ";;"];

const CHINESE_TEXT =
  "我们今天讨论大型语言模型的推理服务系统。在预填充和解码分离的架构中，" +
  "路由器负责把请求分配到合适的工作节点。滑动窗口注意力可以大幅减少键值缓存" +
  "的内存占用，而全局注意力层仍然需要保存所有的历史信息。前缀缓存命中率越高，" +
  "首个词元的延迟就越低。北京上海广州深圳杭州南京成都武汉西安重庆天津苏州。" +
  "人工智能机器学习深度学习自然语言处理计算机视觉强化学习知识图谱。" +
  "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。床前明月光，疑是地上霜。" +
  "學習繁體中文：臺灣、香港、澳門的書寫習慣與簡體字不同。龍鳳麵條廣東話。";
const CHINESE_PUNCT = ["，", "。", "！", "？", "、", "；", "：", "“", "”", "《", "》",
                       "（", "）", "——", "……", "【", "】", "「", "」"];

const MULTILINGUAL = [
  "日本語のテキストを処理します。ひらがな、カタカナ、漢字が混ざっています。",
  "東京都渋谷区でラーメンを食べました。とても美味しかったです！",
  "한국어 문장을 토큰화합니다. 서울특별시 강남구에서 만나요.",
  "안녕하세요, 반갑습니다! 오늘 날씨가 정말 좋네요.",
  "Привет, мир! Это тестовая строка на русском языке.",
  "Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "Γειά σου Κόσμε! Η γρήγορη καφέ αλεπού πηδάει.",
  "مرحبا بالعالم! هذه جملة باللغة العربية للاختبار.",
  "שלום עולם! זה משפט בעברית.",
  "नमस्ते दुनिया! यह हिन्दी में एक वाक्य है।",
  "स्वागत है, कृपया प्रतीक्षा करें।",
  "สวัสดีชาวโลก นี่คือประโยคภาษาไทย",
  "Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ ế ề ể ễ ệ.",
  "Größenwahn, Fußgängerübergänge und Äpfel über Öl.",
  "İstanbul'da ılık bir gün; ığdır, şişli, çöp.",
  "Ça coûte 15 € — c'est très cher, n'est-ce pas ?",
  "ქართული ენა ლამაზია.",
  "Հայերեն լեզու։",
  "Ελληνικά: αβγδεζηθικλμνξοπρστυφχψω ΑΒΓΔ",
  "Español: ¿Dónde está la biblioteca? ¡Aquí!",
  "Português: ação, coração, pão, não.",
  "Polski: zażółć gęślą jaźń.",
  "Čeština: příliš žluťoučký kůň úpěl ďábelské ódy.",
  "Українська: ґанок, їжак, євшан-зілля.",
  "తెలుగు భాష", "தமிழ் மொழி", "ਪੰਜਾਬੀ", "বাংলা ভাষা", "ગુજરાતી",
  "ພາສາລາວ", "မြန်မာဘာသာ", "ភាសាខ្មែរ", "አማርኛ", "ᠮᠣᠩᠭᠣᠯ",
];

const CODE_SNIPPETS = [
  "#include <vector>\n\nint main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x *= 2;\n  return v.size() != 3;\n}\n",
  "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\nprint([fib(i) for i in range(10)])\n",
  "const add = (a, b) => a + b;\nexport default function App() {\n\treturn <div className=\"app\">{add(1, 2)}</div>;\n}\n",
  "fn main() {\n    let s: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", s);\n}\n",
  "{\"model\": \"qwen3\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stream\": true}",
  "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC LIMIT 10;",
  "<!DOCTYPE html>\n<html>\n  <head><title>Test</title></head>\n  <body><p class=\"x\">Hello &amp; bye</p></body>\n</html>\n",
  "for f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}' >> out.log 2>&1\ndone\n",
  "template <typename T>\nconstexpr T clamp(T v, T lo, T hi) noexcept { return v < lo ? lo : (hi < v ? hi : v); }\n",
  "if (x != nullptr && x->next == nullptr) { x->val <<= 2; y ^= ~z; }",
  "    # comment with trailing spaces    \n\tindented_with_tab = {'a': [1, 2.5e-3, None]}\r\n",
  "public static void main(String[] args) throws IOException {\n        System.out.println(\"Hello, World!\");\n    }",
  "x = a ** 2 // 3 % 7; y = (a >> 1) | (b & 0xFF); z = !flag || (p === q && r !== s);",
  "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
  "  - name: prefill\n    replicas: 3\n    resources:\n      limits: {nvidia.com/gpu: 1}\n",
  "CMAKE_CXX_FLAGS=\"-O2 -Wall\" cmake -S . -B build -G Ninja && ninja -C build -j$(nproc)",
  "\\begin{equation} E = mc^2 \\quad \\forall x \\in \\mathbb{R} \\end{equation}",
  "a=[[1,2],[3,4]];b=a.map(r=>r.reduce((s,v)=>s+v,0));console.log(b)//[3,7]",
  "/* multi\n * line\n */\nstatic inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }",
  "async def handler(req):\n    async with session.get(url) as resp:\n        return await resp.json()\n",
];

const CODE_LINES = [
  "return x;", "i++;", "}", "{", "});", "else {", "#define MAX(a, b) ((a) > (b) ? (a) : (b))",
  "import numpy as np", "from typing import List, Optional", "self.x = x",
  "// TODO(someone): fix this", "assert len(xs) == 3, 'bad length'", "std::cout << x << std::endl;",
  "let mut v = Vec::new();", "x: &'a str", "pub fn new() -> Self {", "@property",
  "try:", "except ValueError as e:", "    raise", "catch (const std::exception& e) {",
  "=>", "->", "::", "!==", "<<=", ">>>=", "**kwargs", "*args", "&&", "||", "?.", "??",
];

const EMOJI = [
  "😀", "😂", "🥲", "🤖", "🚀", "🔥", "✨", "❤️", "👍", "👍🏽", "👋🏿", "🙏",
  "👨‍👩‍👧‍👦", "👩🏻‍💻", "🧑‍🚀", "🏳️‍🌈", "🇨🇳", "🇺🇸", "🇯🇵", "🇩🇪", "1️⃣", "#️⃣",
  "☕", "⚡", "✅", "❌", "⭐", "🌍", "🎉", "💯", "🐍", "🦀", "🍜", "🀄", "🃏",
  "©️", "®️", "™️", "↩️", "▶️", "⏩", "🔟", "🆗", "🈶", "㊗️", "🫠", "🫶🏼",
];

const SPACES = [" ", " ", " ", "  ", "\t", "\n", "\n", "\r\n", "\r", "\u3000",
                "\u00a0", "\u2003", "\u2009", "\u202f", "\u000b", "\u000c",
                "\u2028", "\u2029", "\u200b", "\u1680", "\u205f"];

const SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                 "<|box_end|>", "<|vision_start|>", "<|image_pad|>", "<|video_pad|>",
                 "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
                 "<|fim_suffix|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
                 "</tool_response>", "<think>", "</think>"];
const NEAR_SPECIAL = ["<|im_", "<|im_end|", "<|im_end", "|>", "<|", "<<|im_end|>>",
                      "<think", "</think", "<thinks>", "<|IM_END|>", "< |im_end|>",
                      "<|endoftext|", "<|im_start|><|im_start|>"];

// Code point ranges for random strings: long-established, mostly assigned.
const RANGES = [
  [0x20, 0x7e, 30], [0xa1, 0xff, 6], [0x100, 0x17e, 4], [0x180, 0x24f, 2],
  [0x250, 0x2af, 1], [0x2b0, 0x2ff, 1], [0x300, 0x36f, 3], [0x370, 0x3ff, 2],
  [0x400, 0x4ff, 3], [0x531, 0x556, 1], [0x5d0, 0x5ea, 1], [0x621, 0x64a, 2],
  [0x660, 0x669, 1], [0x900, 0x97f, 2], [0x966, 0x96f, 1], [0xe01, 0xe3a, 1],
  [0x10a0, 0x10c5, 1], [0x1100, 0x1112, 1], [0x1161, 0x1175, 1], [0x11a8, 0x11c2, 1],
  [0x1e00, 0x1eff, 2], [0x2010, 0x2027, 2], [0x2030, 0x205e, 1], [0x2070, 0x209c, 1],
  [0x20a0, 0x20b9, 1], [0x2100, 0x214f, 1], [0x2150, 0x2188, 1], [0x2190, 0x21ff, 1],
  [0x2200, 0x22ff, 1], [0x2460, 0x24ff, 1], [0x2500, 0x257f, 1], [0x25a0, 0x25ff, 1],
  [0x2600, 0x26ff, 1], [0x3000, 0x303f, 2], [0x3041, 0x3096, 3], [0x30a1, 0x30fa, 3],
  [0x4e00, 0x9fa5, 12], [0xac00, 0xd7a3, 4], [0xf900, 0xfa2d, 1], [0xff01, 0xff5e, 2],
  [0xff61, 0xff9f, 1], [0x1d400, 0x1d6a3, 1], [0x1f300, 0x1f64f, 3], [0x1f680, 0x1f6c5, 1],
  [0x20000, 0x2a6d6, 1],
];

function sanitize(s) {
  return s.replace(/[\u0085\ufeff]/g, "").replace(/'\u017f/g, "'s");
}

function capitalize(w) {
  return w.charAt(0).toUpperCase() + w.slice(1);
}

function englishSentence(rng) {
  const n = rng.int(3, 25);
  const parts = [];
  for (let i = 0; i < n; ++i) {
    let w = rng.chance(0.08) ? rng.pick(CONTRACTIONS) : rng.pick(WORDS);
    if (i === 0 || rng.chance(0.05)) w = capitalize(w);
    if (rng.chance(0.02)) w = w.toUpperCase();
    parts.push(w);
    if (rng.chance(0.12)) parts[parts.length - 1] += rng.pick(PUNCT);
  }
  let s = parts.join(" ") + rng.pick([".", "!", "?", "", ".\n", "...", ":"]);
  if (rng.chance(0.1)) s = "\"" + s + "\"";
  if (rng.chance(0.05)) s += " See https://example.com/a/b?q=1&r=2#frag or mail a.b@c.org.";
  return s;
}

function chineseText(rng) {
  const mode = rng.int(0, 4);
  if (mode <= 1) {  // a slice of real text
    const start = rng.int(0, CHINESE_TEXT.length - 2);
    return Array.from(CHINESE_TEXT).slice(start, start + rng.int(1, 80)).join("");
  }
  if (mode === 2) {  // random common-range characters with punctuation
    let s = "";
    const n = rng.int(1, 60);
    for (let i = 0; i < n; ++i) {
      s += rng.chance(0.12) ? rng.pick(CHINESE_PUNCT)
                            : String.fromCodePoint(rng.int(0x4e00, 0x9fa5));
    }
    return s;
  }
  // mixed Chinese, English, digits
  const chars = Array.from(CHINESE_TEXT);
  let s = "";
  const n = rng.int(2, 12);
  for (let i = 0; i < n; ++i) {
    const k = rng.int(0, 3);
    if (k === 0) s += rng.pick(WORDS);
    else if (k === 1) s += String(rng.int(0, 100000));
    else s += chars.slice(rng.int(0, chars.length - 10), undefined).slice(0, rng.int(1, 8)).join("");
    if (rng.chance(0.4)) s += rng.pick([" ", "", "，", "。", " (", ") "]);
  }
  return s;
}

function codeText(rng) {
  if (rng.chance(0.5)) {
    let s = rng.pick(CODE_SNIPPETS);
    if (rng.chance(0.3)) s = s.replace(/\n/g, "\r\n");
    if (rng.chance(0.3)) s = s.replace(/    /g, "\t");
    return s;
  }
  const n = rng.int(1, 8);
  const lines = [];
  for (let i = 0; i < n; ++i) {
    const indent = rng.pick(["", "  ", "    ", "        ", "\t", "\t\t", "   "]);
    lines.push(indent + rng.pick(CODE_LINES) + rng.pick(["", " ", "  ", ";"]));
  }
  return lines.join(rng.pick(["\n", "\n", "\r\n", "\n\n", "\n   \n"]));
}

function emojiText(rng) {
  let s = "";
  const n = rng.int(1, 10);
  for (let i = 0; i < n; ++i) {
    if (rng.chance(0.4)) s += rng.pick(WORDS) + rng.pick([" ", "", "! "]);
    s += rng.pick(EMOJI);
    if (rng.chance(0.3)) s += " ";
  }
  return s;
}

function whitespaceText(rng) {
  let s = "";
  const n = rng.int(1, 12);
  for (let i = 0; i < n; ++i) {
    const k = rng.int(1, rng.chance(0.2) ? 40 : 6);
    for (let j = 0; j < k; ++j) s += rng.pick(SPACES);
    if (rng.chance(0.7)) s += rng.pick(WORDS.concat(["{", "}", "//", "1", "\u4e2d", "!"]));
  }
  return s;
}

function digitText(rng) {
  const k = rng.int(0, 9);
  const digits = (n) => {
    let s = "";
    for (let i = 0; i < n; ++i) s += String(rng.int(0, 9));
    return s;
  };
  switch (k) {
    case 0: return digits(rng.int(1, 40));
    case 1: return "$" + digits(rng.int(1, 3)) + "," + digits(3) + "." + digits(2);
    case 2: return "-" + digits(rng.int(1, 5)) + "." + digits(rng.int(1, 8)) + "e-" + digits(2);
    case 3: return "+1 (" + digits(3) + ") " + digits(3) + "-" + digits(4);
    case 4: return "20" + digits(2) + "-0" + rng.int(1, 9) + "-1" + rng.int(0, 9) + "T" + digits(2) + ":" + digits(2) + "Z";
    case 5: return "0x" + rng.int(0, 0xffffff).toString(16) + " 0b1011 1e9 3.14159";
    case 6: return "٠١٢٣٤٥٦٧٨٩ ०१२३४५६७८९ ０１２３４５ " + digits(rng.int(1, 6));
    case 7: return "x² + y³ = z⁴; ½ + ¼ = ¾; Ⅻ ⅲ ① ⑳ ⒈ 𝟘𝟙𝟚";
    case 8: return "version " + digits(1) + "." + digits(rng.int(1, 2)) + "." + digits(rng.int(1, 3)) + "-rc" + digits(1);
    default: return englishSentence(rng).replace(/ /g, " " + digits(rng.int(1, 4)) + " ");
  }
}

function nfcText(rng) {
  const marks = [0x300, 0x301, 0x302, 0x303, 0x308, 0x30a, 0x323, 0x327, 0x328, 0x331];
  const k = rng.int(0, 6);
  if (k === 0) {  // base + combining marks in random order
    let s = "";
    const n = rng.int(1, 6);
    for (let i = 0; i < n; ++i) {
      s += rng.pick(["a", "e", "o", "u", "A", "n", "c", "s", "z", " ", "1"]);
      const m = rng.int(0, 3);
      for (let j = 0; j < m; ++j) s += String.fromCodePoint(rng.pick(marks));
    }
    return s;
  }
  if (k === 1) return "Ha\u0300ng\u0323i\u0300 ca\u0301fe\u0301 n\u0303 \u212b\u2126\u212a";
  if (k === 2) {  // conjoining Hangul jamo
    let s = "";
    const n = rng.int(1, 5);
    for (let i = 0; i < n; ++i) {
      s += String.fromCodePoint(rng.int(0x1100, 0x1112), rng.int(0x1161, 0x1175));
      if (rng.chance(0.5)) s += String.fromCodePoint(rng.int(0x11a8, 0x11c2));
    }
    return s;
  }
  if (k === 3) {  // CJK compatibility ideographs
    let s = "";
    for (let i = rng.int(1, 6); i > 0; --i) s += String.fromCodePoint(rng.int(0xf900, 0xfa0d));
    return s + " 漢字";
  }
  if (k === 4) return "\u0915\u093c \u0958 \u09c7\u09be \u0b47\u0b3e \u0dd9\u0dcf\u0dca";
  if (k === 5) return "\u304b\u3099\u304d\u3099 \u30cf\u309a \u3046\u3099";
  return rng.pick(WORDS).normalize("NFD") + " " + rng.pick(MULTILINGUAL).normalize("NFD");
}

function specialText(rng) {
  const n = rng.int(1, 6);
  let s = "";
  for (let i = 0; i < n; ++i) {
    const k = rng.int(0, 3);
    if (k === 0) s += rng.pick(SPECIAL);
    else if (k === 1) s += rng.pick(NEAR_SPECIAL);
    else if (k === 2) s += englishSentence(rng);
    else s += rng.pick(["\n", "user\n", "assistant\n", " ", "system\nYou are helpful."]);
  }
  return s;
}

function randomText(rng) {
  let total = 0;
  for (const r of RANGES) total += r[2];
  const n = rng.int(1, 40);
  let s = "";
  const unassigned = /\p{Cn}|\p{Cs}/u;
  while (Array.from(s).length < n) {
    let w = rng.next() * total;
    let r = RANGES[0];
    for (const x of RANGES) {
      w -= x[2];
      if (w < 0) { r = x; break; }
    }
    const c = String.fromCodePoint(rng.int(r[0], r[1]));
    if (unassigned.test(c)) continue;
    s += c;
  }
  return s;
}

const EDGE = [
  "", " ", "  ", "\n", "\n\n", "\r\n", "\t", "a", "A", "1", "!", "'", "''", "'s", "'S",
  "''s", "x's's", "'s'", "' s", " 's", "'sa", "'ll've", "don''t", "it’s", "I‘m",
  "!!!\n\n\n", "...\r\n", " \n", "\n ", " \n ", "a\r\nb", "a \n b", "a  \n  b",
  "   leading", "trailing   ", "  both  ", "\t\ttabs\t\t", "a\u3000b", "\u3000\u3000x",
  "\u00a0nbsp\u00a0", "zero\u200bwidth", "zw\u200dj", "\u2028line\u2029para",
  "\u0000\u0001\u0002\u001f\u007f", "\u0080\u009f", "\ufffd", "\uffff",
  "a\u0301", "\u0301", " \u0301", "\u0301a", "ab\u0301cd", "1\u0301",
  "中", " 中", "中文", "$$$", "!!!", "???", "$\n", "#\n\n", "a!\n", " !", " ! ",
  "a1b2c3", "123abc", "abc123", "１２３", "Ⅳ", "x²", "..\n..", "  \n\n  \n",
  " ".repeat(17), "\n".repeat(9), "\t".repeat(5), "-".repeat(80), "=".repeat(120),
  "a".repeat(64), "ab".repeat(50), "😀".repeat(20), "中".repeat(60),
  Array.from({ length: 95 }, (_, i) => String.fromCharCode(32 + i)).join(""),
];

function longTexts(rng) {
  const out = [];
  out.push(" ".repeat(3000));
  out.push("word" + " ".repeat(1000) + "word" + "\n".repeat(500) + "end");
  out.push(("\t \n").repeat(400));
  out.push(Array.from(CHINESE_TEXT).join("").repeat(4));
  out.push(CODE_SNIPPETS.join("\n\n"));
  out.push(Array.from({ length: 40 }, () => englishSentence(rng)).join(" "));
  out.push("9".repeat(2000));
  out.push(MULTILINGUAL.join(" "));
  out.push(Array.from({ length: 30 }, () => emojiText(rng)).join(""));
  out.push("z".repeat(1500));
  return out;
}

const GENERATORS = [
  ["english", englishSentence, 420],
  ["chinese", chineseText, 330],
  ["code", codeText, 300],
  ["emoji", emojiText, 160],
  ["whitespace", whitespaceText, 260],
  ["digits", digitText, 220],
  ["multilingual", (rng) => {
    const k = rng.int(1, 3);
    const parts = [];
    for (let i = 0; i < k; ++i) {
      const s = Array.from(rng.pick(MULTILINGUAL));
      const a = rng.int(0, s.length - 1);
      parts.push(s.slice(a, a + rng.int(1, s.length)).join(""));
    }
    return parts.join(rng.pick([" ", "\n", ""]));
  }, 260],
  ["nfc", nfcText, 140],
  ["special", specialText, 160],
  ["random", randomText, 420],
];

function buildCorpus(seed) {
  const rng = new Rng(seed);
  const cases = [];
  for (const [category, gen, count] of GENERATORS) {
    for (let i = 0; i < count; ++i) cases.push({ category, text: sanitize(gen(rng)) });
  }
  for (const text of EDGE) cases.push({ category: "edge", text: sanitize(text) });
  for (const text of longTexts(rng)) cases.push({ category: "long", text: sanitize(text) });
  return cases;
}

module.exports = { buildCorpus, sanitize };
