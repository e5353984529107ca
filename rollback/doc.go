// Package rollback is the rollback stage, beside migrate: the journals of the
// runs undone, each read whole and verified first (undo.CheckUndo), then read
// backwards in bounded memory and undone batch by batch with compare-and-swap,
// a record put back only where the key still holds what that run wrote; its
// own undo journaled as it goes, its first write through guard.FirstWrite and
// its writes kept below etcd's quota by guard's space guard.
package rollback
