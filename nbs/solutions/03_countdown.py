"""Worked solutions to the exercises of chapter 03, A task where exploration matters."""

from hara_ref.rlvr.countdown import Countdown, countdown_reward, left_to_right, solutions

# Exercise 1: the strategies of 3,5,8:29, and of 3,5,8:23
p = Countdown((3, 5, 8), 29)
s29 = solutions(p)
ltr29 = [st for st in left_to_right(p.numbers) if st[-1][-1] == 29]
print('29:', sorted(s29), 'left to right:', ltr29)
assert len(s29) == 1 and ltr29 == []  # one strategy, 3*8+5, and it is not left to right
s23 = solutions(Countdown((3, 5, 8), 23))
ltr23 = [st for st in left_to_right((3, 5, 8)) if st[-1][-1] == 23]
print('23:', sorted(s23), 'left to right:', ltr23)
assert len(s23) >= 1

# Exercise 2: responses that end in \boxed{29} and are refused, one per rule
good = '3*8=24;24+5=29;\\boxed{29}'
assert countdown_reward(good, p.answer) == 1.0
refused = {
    'an operand used twice': '3*8=24;24+8=32;32-3=29;\\boxed{29}',
    'a wrong result': '3*8=24;24+5=30;\\boxed{29}',
    'a negative result': '3-8=-5;5*8=40;\\boxed{29}',
}
for why, text in refused.items():
    assert countdown_reward(text, p.answer) == 0.0, why

# Exercise 3: (a op1 b) op2 c has 3 x 3 = 9 ordered forms; on 9,2,1 all are non-negative and
# their values differ, so each value's problem has a left-to-right strategy among its solutions
forms = left_to_right((9, 2, 1))
values = [st[-1][-1] for st in forms]
assert len(forms) == 9 and len(set(values)) == 9
for v in values:
    assert any(st[-1][-1] == v for st in left_to_right((9, 2, 1)))
    assert len(solutions(Countdown((9, 2, 1), v))) >= 1
print('left-to-right values of 9,2,1:', sorted(values))
