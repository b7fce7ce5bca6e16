"""Requests to jobs, without a transport: what the server and `batch` share.

- `types`: the request bodies (native and OpenAI fields, pydantic), validated the
  same way whether they come over HTTP or from a JSONL record;
- `build`: a request or a record -> its Job (one path, one grammar rule);
- `chat`: chat messages to a prompt with the model's template;
- `prediction`: a predicted output -> the token ids its drafter proposes;
- `scheduler`: the slots, a job per request, one engine step for all of them.

Nothing here knows HTTP: errors are `ngramspec.errors` types, which the server maps
to status codes (`server/errors.py`) and `batch` to error records.
"""
