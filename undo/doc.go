// Package undo is what an undo is: the state directory and its run
// directories (one per writing run: its record, journal, snapshot before the
// first write, plan and summary; the only package that writes them), the
// journal of old values (records numbered and chained by sha256), its
// readers (forwards, and backwards for a rollback) and its verification
// (CheckJournal, CheckUndo: every value a rollback would put back decrypted
// first; CheckRun), the checksums of a run's files, and the removal of old
// runs (Prune: the oldest only, a run left part-way kept with the reruns
// that finished it). The rollback that reads the journals is package
// rollback; the checks and guards around a run's writes are package guard.
//
// # Journal format
//
// A journal is JSON lines, one record a line (JournalRecord), appended and
// synced before each batch of writes is sent (the batches in flight share
// their fsyncs: a group commit, see Journal). Every record carries "seq", its
// number in the journal from 1, first, and "sum", its checksum, last: the
// line is the record's JSON object without its closing brace (P), then
// ,"sum":"<hex>"} and a newline, where <hex> is the sha256 of the previous
// record's checksum (32 bytes; 32 zero bytes for the first record) followed
// by P. A record's checksum thus covers its key, revisions, old value and
// number, and every record before it: a flipped bit changes its checksum, a
// record moved, removed, repeated or taken from another journal breaks the
// numbering or the chain, and a journal cut at a record boundary is shorter
// than its run recorded. A writer that closes the journal appends a "close"
// record; one that appends to an existing journal goes on from its last
// record's number and checksum (a journal whose last record was cut short is
// refused: a record after it would leave it damaged inside).
//
// When a run ends, its record (run.json) gets the journal's size, sha256 and
// number of records (journalSum), its snapshot's size and sha256
// (snapshotSum, beside etcd's own sha256 trailer inside the file), and the
// encryption providers and keys of the old values the journal holds
// (undoNeedsKeys). CheckJournal reads a journal whole, one record at a time:
// every checksum, the numbering, and for a run that recorded its end the
// size and sha256 it recorded; the first record that does not verify is a
// *JournalDamageError naming the file, the record and its key. A run that
// did not record its end (killed) may leave its last record cut short: that
// record, and only it, is passed over (its batch was never sent). A journal
// written before records were checksummed (no "sum") is read whole and said
// unverifiable: a rollback refuses it unless the operator allows it.
package undo
