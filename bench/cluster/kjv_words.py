#!/usr/bin/python3
"""Writes a prompt of N random KJV-like words (~1.09 demo-model tokens per
word) to PATH, seeded by N: the long-prompt scripts of bench/cluster.

    /usr/bin/python3 bench/cluster/kjv_words.py 180000 /tmp/prompt.txt
"""
import random
import sys

WORDS = ("and the lord said unto moses behold i will bring thee to the land of israel that he "
         "may go in the house of his fathers and ye shall be upon them in that day").split()

if __name__ == "__main__":
    n, path = int(sys.argv[1]), sys.argv[2]
    random.seed(n)
    with open(path, "w") as f:
        f.write(" ".join(random.choice(WORDS) for _ in range(n)))
