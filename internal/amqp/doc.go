// Package amqp is Courier's AMQP 0-9-1 gateway. This part holds the codec:
// frames, the methods of the classes RabbitMQ's clients use, the content
// header with the basic properties, and field tables.
//
// A frame on the wire (all integers big-endian):
//
//	+------+---------+---------+-------------+------+
//	| type | channel |  size   |   payload   | 0xCE |
//	|  u8  |   u16   |   u32   | size octets |  u8  |
//	+------+---------+---------+-------------+------+
//
// The type is 1 (method), 2 (content header), 3 (content body) or 8
// (heartbeat). A method payload starts with its class and method ids (u16
// each) followed by the method's fields; consecutive bit fields share one
// octet, lowest bit first. A content header payload is the class id, a
// u16 weight (0), the u64 body size and the property flags and values.
//
// The codec trusts nothing it reads: a [Reader] refuses a frame larger than
// the negotiated frame_max before reading its payload, field tables nest at
// most [MaxTableDepth] deep, and every length is checked against the bytes
// that remain. A malformed frame is reported as an [*Error] carrying the
// AMQP reply code (501 frame error, 502 syntax error, 503 command invalid,
// 505 unexpected frame) that the connection sends in connection.close before
// it closes; only that connection is affected. Deadlines on reads and
// writes are the connection's: the codec reads from and writes to what it
// is given.
package amqp
