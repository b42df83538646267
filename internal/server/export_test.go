package server

// SetReadHook sets testHookRead for the tests of package server_test; nil
// removes it.
func SetReadHook(h func()) {
	if h == nil {
		testHookRead.Store(nil)
		return
	}
	testHookRead.Store(&h)
}

// SetPark turns the waiters of idle connections (park.go) on or off for
// the connections accepted from then on.
func SetPark(on bool) { noPark.Store(!on) }
