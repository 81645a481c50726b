// Package ops answers the operator's questions about a relay from Postgres
// alone: how far behind is the slot (Lag), is a relay streaming it now
// (Status), and where is its checkpoint (CheckpointShow). It reads catalog views and the relay's own tables over an ordinary
// connection and never opens a replication connection, so it works whether or
// not a relay is running and never disturbs one that is.
//
// Invariants:
//
//   - Read-only: every statement is a SELECT; nothing here creates, advances or
//     drops a slot or writes a table.
//   - Ages are computed from the server's clock (now() in the same statement
//     that reads created_at and commit times), so a skewed client clock does
//     not distort them.
//   - A missing slot is an error wrapping pgslot.ErrNotFound (run `outbox-relay setup`); a missing
//     checkpoint or retry table is not an error: those figures are reported as
//     absent (JSON null).
//
// # Time lag is an approximation
//
// Postgres does not record when a WAL record was written, so the time lag is
// estimated from the outbox table: the oldest event not yet delivered is the
// row with the smallest created_at that is later than the commit time of the
// last delivered transaction (checkpoint column last_commit_time). created_at
// defaults to now(), which is the start time of the inserting transaction, not
// its commit time, so:
//
//   - a row from a transaction that started before the last delivered commit
//     but committed after it is not counted (the estimate can only be too
//     optimistic, never too pessimistic);
//   - when the outbox table is empty (applications that delete rows in the same
//     transaction, or right after inserting them) the state is "unknown"; use
//     lag_bytes, which is exact, instead.
//
// # JSON fields (stable; new fields may be added, none renamed or removed)
//
// `outbox-relay lag --json` prints one LagReport object:
//
//	slot_name                      string  the replication slot examined
//	checked_at                     string  server time of the check (RFC 3339)
//	slot.active                    bool    a backend is connected to the slot
//	slot.active_pid                int     that backend's PID, or null
//	slot.application_name          string  its application_name ("outbox-relay/<version>"), or null
//	slot.client_addr               string  its client address, or null (local socket or no privilege)
//	slot.backend_start             string  when it connected, or null
//	slot.walsender_state           string  pg_stat_replication.state ("streaming", "catchup", ...), or null
//	slot.confirmed_flush_lsn       string  the position the relay confirmed, e.g. "0/16B3748", or null
//	slot.restart_lsn               string  the oldest WAL the slot still needs, or null
//	slot.wal_status                string  "reserved", "extended", "unreserved" or "lost", or null
//	slot.safe_wal_size_bytes       int     WAL that can still be written before the slot is at risk of
//	                                       being lost, or null when max_slot_wal_keep_size is unlimited
//	                                       or the slot is already lost
//	max_slot_wal_keep_size         string  the server's setting as SHOW prints it: "-1", "1MB", "10GB"
//	max_slot_wal_keep_size_bytes   int     the same in bytes (pg_settings keeps it in MB), or null when -1 (unlimited)
//	current_wal_lsn                string  pg_current_wal_lsn()
//	lag_bytes                      int     current_wal_lsn - confirmed_flush_lsn, or null
//	reading                        object  the transaction a relay has been reading for a second or more
//	                                       and not confirmed, as it records it in its checkpoint row (the
//	                                       server decodes a transaction whole before sending it, and the
//	                                       relay confirms the positions reported meanwhile, so lag_bytes
//	                                       misses it), or null: {commit_lsn, since, age_seconds, events,
//	                                       bytes (as pgoutput sent them), updated_at}
//	behind_bytes                   int     lag_bytes + reading.bytes: what --max-bytes checks, or null
//	retained_wal_bytes             int     current_wal_lsn - restart_lsn: WAL kept on disk for the slot, or null
//	checkpoint                     object  the relay's saved checkpoint, or null when none is saved
//	checkpoint.lsn                 string  last delivered position saved by the relay
//	checkpoint.saved_at            string  when it was saved, or null
//	checkpoint.last_commit_time    string  commit time of the last delivered transaction, or null
//	time_lag.state                 string  "behind", "caught_up" or "unknown" (see above); never
//	                                       "caught_up" for a lost or unreserved slot (then "unknown")
//	time_lag.oldest_undelivered_at string  created_at of the oldest undelivered event, or null
//	time_lag.seconds               number  age of that event; 0 when caught up; null when unknown
//	time_lag.last_delivered_age_seconds
//	                               number  now - checkpoint.last_commit_time, or null
//	tables                         array   with outbox.tables only: {table, time_lag} of each of them
//	                                       (time_lag above is outbox.table's); absent otherwise
//	retry                          object  the retry table's figures, or null when it does not exist
//	retry.pending                  int     events waiting for another attempt
//	retry.dead                     int     events that will not be retried (dead letters)
//	retry.oldest_pending_age_seconds
//	                               number  now - first_failed_at of the oldest pending event, or null
//	wal_buffer                     object  absent unless the WAL buffer holds events of the slot: the relay
//	                                       is buffering (postgres.max_retained_wal): {table, events, bytes,
//	                                       since (when the oldest held was buffered), oldest_commit_lsn}
//	slot_gap                       object  null, or: the slot does not continue from the checkpoint and
//	                                       run refuses to stream it (exit 4; DESIGN invariant 14)
//	slot_gap.cause                 string  "slot_ahead" (dropped and recreated, advanced, or read by another
//	                                       consumer), "slot_invalidated", "other_system", "timeline_forked"
//	slot_gap.from_lsn              string  the checkpoint: the uncovered range starts after it
//	slot_gap.to_lsn                string  where the slot would resume, or null (an invalidated slot)
//	slot_gap.reason, slot_gap.fix  string  what happened, and the commands that deliver the range
//
// `outbox-relay status --json` prints one StatusReport object: slot_name,
// checked_at, streaming (bool: the slot is active and its backend is a
// walsender in pg_stat_replication), version (from application_name
// "outbox-relay/<version>", or null), and slot, checkpoint, slot_gap and
// wal_buffer as above.
//
// `outbox-relay checkpoint show --json` prints one CheckpointReport object:
//
//	slot_name                      string  the replication slot
//	checked_at                     string  server time of the check (RFC 3339)
//	checkpoint                     object  as in lag (lsn, saved_at, last_commit_time), or null when none is saved
//	slot                           object  the slot, or null when it does not exist
//	slot.active                    bool    a backend streams it (a relay: stop it before checkpoint set)
//	slot.confirmed_flush_lsn       string  the position confirmed to the server, or null
//	resume_lsn                     string  where `run` starts: the later of checkpoint.lsn and
//	                                       slot.confirmed_flush_lsn, or null when neither exists
//	current_wal_lsn                string  pg_current_wal_lsn()
//	history                        object  the checkpoint history of the slot, or null when its table does not exist
//	history.table                  string  its name (checkpoint.table + "_history")
//	history.count                  int     rows for this slot
//	history.oldest, history.newest object  by LSN: {lsn, last_commit_time (null when unknown), saved_at}; null when no rows
//	retention_horizon              object  the newest history row the checkpoint covers, or null:
//	                                       {lsn, last_commit_time, saved_at, snapshot_xmin (int), snapshot_lsn};
//	                                       rows of transactions older than snapshot_xmin are delivered
//	retention_horizon_missing      string  why there is no horizon (retention then deletes nothing), or null
//
// # Exit codes of `outbox-relay lag`
//
//	0  no threshold exceeded (or none given)
//	1  error: cannot connect, slot missing, query failed; or the slot is lost
//	   (wal_status lost: like a missing slot, it can never stream again)
//	2  bad flags or configuration (the CLI's code for every command)
//	3  --max-bytes (behind_bytes) or --max-seconds exceeded
//	4  the slot does not continue from the checkpoint (slot_gap): run refuses it;
//	   the report is printed first (a missing slot's too: no WAL figures then),
//	   and `outbox-relay status` exits 4 likewise (StatusReport.Problem)
package ops
