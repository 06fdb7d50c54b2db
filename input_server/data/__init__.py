"""Documents, before they are batched: a spec's files read by format (`jsonl`, `parquet`,
`tfrecord`, ...) within the server's data roots into one random-access `DocumentSource`, the
seeded order that says which record is a stream's n-th document (`order`, `mixture`), and the
tokenizers (`tokenizers/`, `token_cache`) that turn its text into ids for `batching`."""
