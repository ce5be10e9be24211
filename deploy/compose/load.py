"""Load for the kvscope demo: shared prompts sent to an OpenAI-compatible completions endpoint, forever.

PROMPTS prompts of PROMPT_TOKENS token ids each are drawn at random (a few prompts far more often than
the rest, as real traffic reuses a hot set), CONCURRENCY at a time, so the engine's cache tiers see hits,
misses, promotions and evictions. Standard library only: it runs in the kvscope image and in the tests.

    python load.py --url http://engine:8000 [--prompts 12] [--prompt-tokens 2048] [--concurrency 4]
                   [--requests N (0: forever)] [--model NAME] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request

VOCAB = 200_000


def prompts(count: int, tokens: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(tokens)] for _ in range(count)]


def send(url: str, model: str, prompt: list[int], timeout: float) -> bool:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            response.read()
        return True
    except (urllib.error.URLError, OSError):
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the engine's base URL, e.g. http://engine:8000")
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=0, help="stop after this many requests (0: never)")
    p.add_argument("--model", default="openai/gpt-oss-120b")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args(argv)
    pool = prompts(args.prompts, args.prompt_tokens, args.seed)
    weights = [1.0 / (rank + 1) for rank in range(len(pool))]  # Zipf-like: a hot set and a long tail
    lock = threading.Lock()
    sent = {"ok": 0, "failed": 0, "started": 0}

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while True:
            with lock:
                if args.requests and sent["started"] >= args.requests:
                    return
                sent["started"] += 1
            ok = send(args.url, args.model, rng.choices(pool, weights)[0], args.timeout)
            with lock:
                sent["ok" if ok else "failed"] += 1
            if not ok:
                time.sleep(1.0)  # the engine is not up (yet): retry without hammering it

    threads = [threading.Thread(target=worker, args=(args.seed + i + 1,), daemon=True)
               for i in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"{sent['ok']} requests answered, {sent['failed']} failed", flush=True)
    return 0 if sent["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
