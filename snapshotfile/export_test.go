package snapshotfile

// WithoutKeepAlive turns the lease keepalives off, so that a test can show
// what they prevent.
func WithoutKeepAlive(o *Options) { o.noKeepAlive = true }
