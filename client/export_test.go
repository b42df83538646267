package client

// SetReadHook sets testHookRead for the tests of package client_test;
// nil removes it.
func SetReadHook(h func()) {
	if h == nil {
		testHookRead.Store(nil)
		return
	}
	testHookRead.Store(&h)
}
