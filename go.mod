module github.com/courier-mq/courier

go 1.26

require (
	github.com/cespare/xxhash/v2 v2.3.0
	github.com/expr-lang/expr v1.17.8
)
