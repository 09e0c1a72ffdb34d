"""Builds the demo model's corpus from Debian's King James Version.

  /usr/bin/python3 tools/train/prepare_corpus.py --out /tmp/demo-corpus

Needs the Debian packages bible-kjv (the `bible` program) and bible-kjv-text
(its data; the KJV text is in the public domain, see models/demo/LICENSE.md).
Torch-free; deterministic.

Output (in --out):
  documents.jsonl  one JSON object per chapter: {"id", "book", "chapter",
                   "split": "train"|"valid", "verses": [...]}
  train.txt        the training chapters as text (tokenizer training input)
  valid.txt        the held-out chapters as text
  train_stream.txt what the model is trained on: every training chapter,
                   and CHAT_PER_CHAPTER ChatML conversations per training
                   chapter, in a seeded random order, each followed by
                   <|endoftext|>
  valid_stream.txt the held-out chapters, each followed by <|endoftext|>
                   (validation loss is measured on this alone)

A conversation teaches the chat format of lib/model/chat_template.h: the user
turn is one verse, the assistant turn the next one to three verses of the
same chapter, ended by <|im_end|>:
  <|im_start|>user\n{verse i}<|im_end|>\n<|im_start|>assistant\n{verse i+1}\n...<|im_end|>\n

A chapter's text is "<Book> <n>\\n" followed by one verse per line (verse
numbers dropped). The held-out split is every chapter whose running index
(0-based, Genesis 1 = 0) is 19 mod 40: 30 of the 1,189 chapters, spread over
the whole book.
"""

import argparse
import json
import os
import random
import re
import subprocess
import sys

VALID_MOD, VALID_REM = 40, 19
CHAT_PER_CHAPTER = 2
SEED = 1611
EOT = "<|endoftext|>"


def read_kjv():
    """[(book, chapter, [verse texts])] in canonical order."""
    out = subprocess.run(["bible", "-m", "8192", "-l100000", "gen1:1-rev22:21"],
                         check=True, capture_output=True, text=True).stdout
    chapters = []
    head = re.compile(r"^(.+?) (\d+)$")
    verse = re.compile(r"^\s+(\d+) (.*\S)\s*$")
    for line in out.splitlines():
        if not line.strip():
            continue
        m = verse.match(line)
        if m and chapters:
            chapters[-1][2].append(m.group(2))
            continue
        m = head.match(line)
        if not m:
            sys.exit(f"unexpected line from bible: {line!r}")
        chapters.append((m.group(1), int(m.group(2)), []))
    return chapters


def chapter_text(book, chapter, verses):
    return f"{book} {chapter}\n" + "\n".join(verses) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    chapters = read_kjv()
    if len(chapters) != 1189:
        sys.exit(f"expected 1189 chapters, got {len(chapters)}")
    n_verses = sum(len(v) for _, _, v in chapters)
    with open(os.path.join(args.out, "documents.jsonl"), "w") as docs, \
         open(os.path.join(args.out, "train.txt"), "w") as train, \
         open(os.path.join(args.out, "valid.txt"), "w") as valid:
        for i, (book, ch, verses) in enumerate(chapters):
            split = "valid" if i % VALID_MOD == VALID_REM else "train"
            docs.write(json.dumps({"id": i, "book": book, "chapter": ch, "split": split,
                                   "verses": verses}) + "\n")
            (valid if split == "valid" else train).write(chapter_text(book, ch, verses) + "\n")
    rng = random.Random(SEED)
    pieces = []
    for i, (book, ch, verses) in enumerate(chapters):
        if i % VALID_MOD == VALID_REM:
            continue
        pieces.append(chapter_text(book, ch, verses))
        for _ in range(CHAT_PER_CHAPTER):
            if len(verses) < 2:
                break
            v = rng.randrange(len(verses) - 1)
            n = rng.randint(1, 3)
            answer = "\n".join(verses[v + 1:v + 1 + n])
            pieces.append(f"<|im_start|>user\n{verses[v]}<|im_end|>\n"
                          f"<|im_start|>assistant\n{answer}<|im_end|>\n")
    rng.shuffle(pieces)
    with open(os.path.join(args.out, "train_stream.txt"), "w") as f:
        f.write("".join(p + EOT for p in pieces))
    with open(os.path.join(args.out, "valid_stream.txt"), "w") as f:
        f.write("".join(chapter_text(b, c, v) + EOT for i, (b, c, v) in enumerate(chapters)
                        if i % VALID_MOD == VALID_REM))
    print(f"{len(chapters)} chapters, {n_verses} verses, {len(pieces)} training pieces "
          f"-> {args.out}")


if __name__ == "__main__":
    main()
