package undo

// WrittenKnown says whether a checksum taken as path was written is kept
// (for the external tests).
func WrittenKnown(path string) bool {
	_, ok := written.Load(sumKey(path))
	return ok
}

// Recall is recall's answer, for the external tests.
func Recall(path string) bool {
	_, ok := recall(path)
	return ok
}
