"""File formats: what TableTune reads and writes, each format's one home (no Dagster, no DuckDB).

Importing this package imports nothing; each module below is imported on its own.

    strict_io         the one strict reader every format uses: regular files only, bounded sizes,
                      strict JSON (stdlib only)
    documents         the JSON documents (identity, profile, prior, table), typed dataclasses with
                      schema versions (numpy + stdlib)
    document_base     what every document shares: the JSON round-trip with its schema check, digests
                      and slugs (stdlib only)
    prior_workload    the workload an acceptance prior records: its bounds and its check (stdlib only)
    fleet             the fleet file (YAML): its schema (pydantic) and loader
    fleet_yaml        the fleet file's strict YAML reading (duplicate keys, aliases, merge keys refused)
    fleet_checks      the fleet file's checks of single values (names, vLLM tokens, one-line strings,
                      JSON values)
    prompts           the prompt-file reader (JSONL, one {"prompt": ...} per line; stdlib only)
    prompt_mixes      the real prompt mixes read from installed packages' data files, and the
                      sample weeks written from them (prompt files with a "mix" label)
    published         the published-table file's strict reader, what the controller loads (stdlib +
                      core.table)
    published_schema  the published file's schema, bounds and typed records (PublishedTable,
                      PublishedPrior, PublishedVersion; stdlib only)
    published_build   building a published document: published_document, the serving envelope,
                      controller_fields (stdlib only)
    published_files   writing a published table: what publishing may replace, the speculative-config
                      companion, the publication lock, the atomic write (stdlib only)
    live_counters     the controller's exported live counters (JSONL; stdlib only)
    control_protocol  the control files between the engine and its plugins (JSON + ack; stdlib only)
    identity_match    the one comparison of engine identities (a published file's or a fleet's against
                      an engine's; stdlib only: the controller uses it too)
"""
