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

// SetSendHook sets testHookSend; nil removes it.
func SetSendHook(h func()) {
	if h == nil {
		testHookSend.Store(nil)
		return
	}
	testHookSend.Store(&h)
}
