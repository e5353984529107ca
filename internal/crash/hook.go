//go:build !crashhook

package crash

// At is where the tests make the tool panic (a build with -tags crashhook):
// nothing in the tool.
func At(string) {}
