// Package debezium reads what a Debezium PostgreSQL connector with the outbox
// EventRouter leaves behind, so that the relay can take over from it: its
// Kafka Connect configuration (ParseProperties, Convert) and its stored
// position, from a standalone worker's offset file (ReadOffsetFile) or a
// distributed cluster's offsets topic (ParseOffsetRecord, LatestOffsets), and
// where the relay must start on Debezium's replication slot (Offset.ResumeLSN).
//
// Everything here is pure: it parses bytes the caller read and does no I/O
// beyond ReadOffsetFile's one file. Errors say which input is wrong and how;
// input that is not what Debezium writes is reported, never guessed at, since
// an offset read wrongly would make the relay skip or repeat events.
package debezium
