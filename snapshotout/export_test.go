package snapshotout

// SetChunkBytes sets how much a build copies between commits (tests).
func SetChunkBytes(n int) (restore func()) {
	old := chunkBytes
	chunkBytes = n
	return func() { chunkBytes = old }
}
