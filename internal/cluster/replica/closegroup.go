package replica

// CloseGroup stops group id on this host, as [Host.Close] stops every
// group: its apply goroutine ends and its waiters fail with ErrClosed.
// The group's records stay in the host's log (releasing them comes with
// the log's release of records); do not open the group again before the
// host restarts. Closing a group that is not open does nothing. A node
// closes the group of a deleted queue (whose id is never used again).
func (h *Host) CloseGroup(id GroupID) error {
	h.mu.Lock()
	g := h.opened[id]
	delete(h.opened, id)
	h.mu.Unlock()
	if g == nil {
		return nil
	}
	err := h.call(func() { delete(h.live, id) })
	g.close(ErrClosed)
	if err == ErrClosed {
		return nil
	}
	return err
}
