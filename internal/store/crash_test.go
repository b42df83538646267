package store

const crashChildEnv = "COURIER_STORE_CRASH_CHILD"

func crashChild() {}
