"""What is kept on the controller: the SQLite store and the private state dir."""
