//go:build race

package tarx

// deepLevels is the depth of the deep-tree test. Its stream grows with
// the square of the depth (every entry names all the levels above it:
// 896 MB at 30,000), which the race detector makes take a minute; 5,000
// levels still need 5,000 descriptors in a walk that holds one per level.
const deepLevels = 5000
