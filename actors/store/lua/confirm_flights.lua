-- confirm_flights: an operator's trigger or backfill appended the fires it put in flight.
-- KEYS[1]  the partition's flight hash   ARGV[1]  the call's token   ARGV[2..] task ids
-- Returns how many ids it looked at. A decision left unconfirmed (the call died, maybe
-- before its append) is taken for never appended by the next decision about the task.
for i = 2, #ARGV do confirm_flight(KEYS[1], ARGV[i], ARGV[1]) end
return #ARGV - 1
