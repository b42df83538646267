package bench

import (
	"math/rand/v2"
	"testing"
)

// TestAssignRooms: every user is in 1 to perUser distinct rooms, and the
// rooms hold about size users each.
func TestAssignRooms(t *testing.T) {
	rooms, n := assignRooms(1000, 100, 3, rand.New(rand.NewPCG(1, 2)))
	if n < 15 || n > 25 { // 2 rooms a user on average: 20 rooms of 100
		t.Fatalf("%d rooms for 1000 users in 1-3 rooms of 100, want about 20", n)
	}
	size := make([]int, n)
	for i, rs := range rooms {
		if len(rs) < 1 || len(rs) > 3 {
			t.Fatalf("user %d in %d rooms", i, len(rs))
		}
		seen := map[int]bool{}
		for _, r := range rs {
			if seen[r] || r < 0 || r >= n {
				t.Fatalf("user %d: rooms %v", i, rs)
			}
			seen[r] = true
			size[r]++
		}
	}
	for r, s := range size {
		if s < 50 || s > 150 {
			t.Errorf("room %d has %d users, want about 100", r, s)
		}
	}
	if rooms, n := assignRooms(3, 100, 3, rand.New(rand.NewPCG(1, 2))); n != 1 || len(rooms[0]) != 1 {
		t.Errorf("3 users: %d rooms, %v", n, rooms)
	}
}

// TestUsersTimelineTitle: the chart says a chat over WebSocket.
func TestUsersTimelineTitle(t *testing.T) {
	res := &UsersResult{Users: 10, RoomSize: 5, WS: true}
	res.Target = "embedded"
	if got, want := res.Timeline().Title, "users: embedded, 10 users in rooms of 5, over WebSocket"; got != want {
		t.Errorf("title %q, want %q", got, want)
	}
}
