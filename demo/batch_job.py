"""The demo's batch job: a small OpenAI Batch API job through the router with the openai SDK, unchanged
(files.create, batches.create, batches.retrieve, files.content), on route `chat`.

    python demo/batch_job.py ROUTER_URL [--lines 4]
"""

from __future__ import annotations

import argparse
import io
import json
import time

import openai


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("router")
    ap.add_argument("--lines", type=int, default=4)
    a = ap.parse_args()
    c = openai.OpenAI(base_url=a.router + "/v1", api_key="demo")
    jobs = b"".join(json.dumps({"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "chat", "max_tokens": 8, "messages": [{"role": "user", "content": f"Summarise document {i}."}]}
    }).encode() + b"\n" for i in range(a.lines))
    f = c.files.create(file=("jobs.jsonl", io.BytesIO(jobs)), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    print(f"file {f.id} ({f.bytes} bytes) -> batch {b.id}: {b.status}")
    deadline = time.monotonic() + 120
    while b.status not in ("completed", "failed", "cancelled", "expired") and time.monotonic() < deadline:
        time.sleep(0.5)
        b = c.batches.retrieve(b.id)
    counts = b.request_counts
    print(f"batch {b.id}: {b.status}, {counts.completed if counts else 0}/{counts.total if counts else 0} answered "
          "(at the lowest priority: only on seats interactive requests leave free)")
    if b.output_file_id:
        for line in c.files.content(b.output_file_id).text.splitlines():
            r = json.loads(line)
            body = r["response"]["body"]
            print(f"  {r['custom_id']}: {r['response']['status_code']} {body['usage']['completion_tokens']} tokens: "
                  f"{body['choices'][0]['message']['content'][:60]}")


if __name__ == "__main__":
    main()
